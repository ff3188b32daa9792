//! The synthesis itself: OpenAPI v3 components of one group/version → the CRDs' schemas.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceConversion, CustomResourceDefinition, CustomResourceDefinitionNames,
    CustomResourceDefinitionSpec, CustomResourceDefinitionVersion, CustomResourceSubresourceStatus,
    CustomResourceSubresources, CustomResourceValidation,
};
use kube::api::ObjectMeta;
use kube::core::Version;
use serde_json::{Map, Value, json};

/// What discovery says about one resource in one group/version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveredVersion {
    /// The version, e.g. `v1`.
    pub version: String,
    /// Kind.
    pub kind: String,
    /// Singular name (may be empty).
    pub singular: String,
    /// Whether instances are namespaced.
    pub namespaced: bool,
    /// Whether discovery lists `<resource>/status`.
    pub has_status: bool,
    /// Short names.
    pub short_names: Vec<String>,
    /// Categories.
    pub categories: Vec<String>,
    /// This version's OpenAPI v3 document (`/openapi/v3/apis/<group>/<version>`), shared by every
    /// resource of the group version.
    pub document: std::sync::Arc<Value>,
}

/// An open object: anything goes below it.
fn open() -> Value {
    json!({ "x-kubernetes-preserve-unknown-fields": true })
}

const FORMATS: &[&str] = &[
    "int32",
    "int64",
    "float",
    "double",
    "byte",
    "binary",
    "date",
    "date-time",
    "password",
    "email",
    "uri",
    "uuid",
    "hostname",
    "ipv4",
    "ipv6",
    "cidr",
    "mac",
    "duration",
    "isbn",
    "isbn10",
    "isbn13",
    "creditcard",
    "ssn",
    "hexcolor",
    "rgbcolor",
    "uuid3",
    "uuid4",
    "uuid5",
    "byte",
];

/// Keys of a CRD schema node that carry over as they are (scalars and simple lists).
const PLAIN_KEYS: &[&str] = &[
    "description",
    "title",
    "maximum",
    "exclusiveMaximum",
    "minimum",
    "exclusiveMinimum",
    "maxLength",
    "minLength",
    "pattern",
    "maxItems",
    "minItems",
    "uniqueItems",
    "multipleOf",
    "enum",
    "maxProperties",
    "minProperties",
    "nullable",
    "x-kubernetes-int-or-string",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-embedded-resource",
];

/// The most schema nodes one synthesized version may have: a provider's document can describe a
/// schema that expands exponentially (components referencing the next one twice), and kbind
/// stops rather than build it.
pub const MAX_SCHEMA_NODES: usize = 100_000;
/// The most schema nodes one discovery may build over all the APIs it synthesizes: many
/// resources each just under [`MAX_SCHEMA_NODES`] would otherwise multiply the work (#32.9).
pub const MAX_DISCOVERY_NODES: usize = 2_000_000;

/// The schema nodes one discovery may still build, shared by every synthesis it runs.
#[derive(Debug)]
pub struct Budget(std::sync::atomic::AtomicUsize);

impl Budget {
    /// A budget of `nodes`.
    pub fn new(nodes: usize) -> Self {
        Self(std::sync::atomic::AtomicUsize::new(nodes))
    }

    /// Nodes left.
    pub fn left(&self) -> usize {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn spend(&self, nodes: usize) {
        let _ = self.0.fetch_update(
            std::sync::atomic::Ordering::Relaxed,
            std::sync::atomic::Ordering::Relaxed,
            |left| Some(left.saturating_sub(nodes)),
        );
    }
}

/// The longest `$ref` chain (a reference to a reference to …) kbind follows.
pub const MAX_REF_CHAIN: usize = 64;
/// How deep a synthesized schema may nest; deeper parts accept anything.
const MAX_DEPTH: usize = 64;

/// One schema node while it is reshaped: keys and values borrowed from the document where they
/// are (a `$ref` chain flattened without copying its subtrees), owned where `allOf` merged them.
type Node<'a> = BTreeMap<Cow<'a, str>, Cow<'a, Value>>;

fn get<'n>(node: &'n Node<'_>, key: &str) -> Option<&'n Value> {
    node.get(key).map(|v| &**v)
}

/// A component expanded once, kept for its next use: its structural form, how many nodes it cost
/// and how deep it reaches below where it starts.
struct Expanded {
    schema: Value,
    nodes: usize,
    height: usize,
}

/// Resolves `$ref`s and reshapes one OpenAPI schema node into a structural CRD schema node,
/// within [`MAX_SCHEMA_NODES`] and [`MAX_REF_CHAIN`].
struct Resolver<'a> {
    components: &'a Map<String, Value>,
    /// Nodes still allowed.
    budget: std::cell::Cell<usize>,
    /// Why the schema could not be synthesized within bounds.
    exceeded: std::cell::RefCell<Option<String>>,
    /// Components expanded without meeting a cycle or the depth bound: their form does not
    /// depend on where they are referenced, so each is expanded once (#32.9).
    memo: std::cell::RefCell<HashMap<String, std::rc::Rc<Expanded>>>,
    /// Cycles and depth cuts met so far (an expansion that met none is context-free).
    cuts: std::cell::Cell<usize>,
    /// The deepest depth reached so far.
    deepest: std::cell::Cell<usize>,
}

impl<'a> Resolver<'a> {
    fn component<'r>(&self, reference: &'r str) -> Option<(&'r str, &'a Value)> {
        let name = reference.strip_prefix("#/components/schemas/")?;
        self.components.get(name).map(|schema| (name, schema))
    }

    fn exceed(&self, why: String) {
        self.exceeded.borrow_mut().get_or_insert(why);
    }

    /// Spends `nodes` of the budget; false (and the reason recorded) when it does not have them.
    fn spend(&self, nodes: usize) -> bool {
        match self.budget.get().checked_sub(nodes) {
            Some(left) => {
                self.budget.set(left);
                true
            }
            None => {
                self.budget.set(0);
                self.exceed(format!(
                    "the schema expands to more than {MAX_SCHEMA_NODES} nodes"
                ));
                false
            }
        }
    }

    /// Flattens a chain of `$ref`s into one node (iteratively, at most [`MAX_REF_CHAIN`] long; the
    /// outer node's keys win), borrowing every value. The component names it expands stay on
    /// `stack` (the returned count) while the caller descends into the node, so that a reference
    /// back to any of them is recognised as a cycle. `None` means a cycle, a missing component or
    /// a chain too long.
    fn dereference<'n>(&self, node: &'n Value, stack: &mut Vec<String>) -> Option<(Node<'n>, usize)>
    where
        'a: 'n,
    {
        let Value::Object(object) = node else {
            return Some((Node::new(), 0));
        };
        let mut chain: Vec<&'n Map<String, Value>> = vec![object];
        let mut pushed = 0;
        let mut current = object;
        while let Some(reference) = current.get("$ref").and_then(Value::as_str) {
            let found = self.component(reference);
            let cycle = found.is_some_and(|(name, _)| stack.iter().any(|n| n == name));
            if cycle {
                self.cuts.set(self.cuts.get() + 1);
            }
            let too_long = chain.len() > MAX_REF_CHAIN;
            if too_long {
                self.exceed(format!(
                    "a $ref chain longer than {MAX_REF_CHAIN} components (at {reference})"
                ));
            }
            let Some((name, Value::Object(target))) = found.filter(|_| !cycle && !too_long) else {
                stack.truncate(stack.len() - pushed);
                return None;
            };
            stack.push(name.to_owned());
            pushed += 1;
            chain.push(target);
            current = target;
        }
        let mut merged = Node::new();
        for level in chain.iter().rev() {
            for (key, value) in level.iter() {
                if key != "$ref" {
                    merged.insert(Cow::Borrowed(key.as_str()), Cow::Borrowed(value));
                }
            }
        }
        Some((merged, pushed))
    }

    /// The structural form of `node`. `stack` holds the component names being expanded. A node
    /// that is only a reference to a component expanded before, context-free, reuses that
    /// expansion (its nodes still count against the budget).
    fn structural<'n>(&self, node: &'n Value, stack: &mut Vec<String>, depth: usize) -> Value
    where
        'a: 'n,
    {
        let reference = node
            .as_object()
            .filter(|o| o.len() == 1)
            .and_then(|o| o.get("$ref"))
            .and_then(Value::as_str)
            .and_then(|r| self.component(r))
            .map(|(name, _)| name);
        let Some(name) = reference.filter(|name| !stack.iter().any(|n| n == name)) else {
            return self.expand(node, stack, depth);
        };
        let known = self.memo.borrow().get(name).cloned();
        if let Some(known) = known
            && depth + known.height <= MAX_DEPTH
        {
            if !self.spend(known.nodes) || self.exceeded.borrow().is_some() {
                return open();
            }
            self.deepest
                .set(self.deepest.get().max(depth + known.height));
            return known.schema.clone();
        }
        let (cuts, budget, deepest) = (self.cuts.get(), self.budget.get(), self.deepest.get());
        self.deepest.set(depth);
        let schema = self.expand(node, stack, depth);
        let reached = self.deepest.get();
        self.deepest.set(deepest.max(reached));
        if self.cuts.get() == cuts && self.exceeded.borrow().is_none() {
            self.memo.borrow_mut().insert(
                name.to_owned(),
                std::rc::Rc::new(Expanded {
                    schema: schema.clone(),
                    nodes: budget - self.budget.get(),
                    height: reached - depth,
                }),
            );
        }
        schema
    }

    fn expand<'n>(&self, node: &'n Value, stack: &mut Vec<String>, depth: usize) -> Value
    where
        'a: 'n,
    {
        if depth > MAX_DEPTH {
            self.cuts.set(self.cuts.get() + 1);
            return open();
        }
        if self.exceeded.borrow().is_some() || !self.spend(1) {
            return open();
        }
        self.deepest.set(self.deepest.get().max(depth));
        let Some((mut object, pushed)) = self.dereference(node, stack) else {
            return open();
        };
        // allOf: merge every branch into this node.
        let all_of = object.remove("allOf");
        if let Some(Value::Array(branches)) = all_of.as_deref() {
            for branch in branches {
                if let Value::Object(resolved) = self.structural_branch(branch, stack, depth) {
                    merge_into(&mut object, resolved);
                }
            }
        }
        // anyOf/oneOf: keep a type only when every branch agrees on it; `not` is dropped.
        for key in ["anyOf", "oneOf"] {
            let branches = object.remove(key);
            if let Some(Value::Array(branches)) = branches.as_deref() {
                let types: BTreeSet<String> = branches
                    .iter()
                    .map(|b| {
                        self.structural_branch(b, stack, depth)
                            .get("type")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_owned()
                    })
                    .collect();
                if !object.contains_key("type") {
                    let set = |object: &mut Node<'n>, key: &'static str, value: Value| {
                        object.insert(Cow::Borrowed(key), Cow::Owned(value));
                    };
                    match types
                        .iter()
                        .map(String::as_str)
                        .collect::<Vec<_>>()
                        .as_slice()
                    {
                        [one] if !one.is_empty() => set(&mut object, "type", json!(one)),
                        ["integer", "string"] => {
                            set(&mut object, "x-kubernetes-int-or-string", json!(true))
                        }
                        _ => set(
                            &mut object,
                            "x-kubernetes-preserve-unknown-fields",
                            json!(true),
                        ),
                    }
                }
            }
        }
        object.remove("not");
        let result = self.finish(object, stack, depth);
        stack.truncate(stack.len() - pushed);
        result
    }

    fn structural_branch<'n>(
        &self,
        branch: &'n Value,
        stack: &mut Vec<String>,
        depth: usize,
    ) -> Value
    where
        'a: 'n,
    {
        self.structural(branch, stack, depth + 1)
    }

    fn finish(&self, object: Node<'_>, stack: &mut Vec<String>, depth: usize) -> Value {
        let mut out = Map::new();
        for key in PLAIN_KEYS {
            if let Some(value) = get(&object, key) {
                out.insert((*key).to_owned(), value.clone());
            }
        }
        if let Some(format) = get(&object, "format").and_then(Value::as_str)
            && FORMATS.contains(&format)
        {
            out.insert("format".into(), json!(format));
        }
        let mut kind = get(&object, "type")
            .and_then(Value::as_str)
            .map(str::to_owned);
        if let Some(Value::Object(properties)) = get(&object, "properties") {
            let properties: Map<String, Value> = properties
                .iter()
                .map(|(name, schema)| (name.clone(), self.structural(schema, stack, depth + 1)))
                .collect();
            out.insert("properties".into(), Value::Object(properties));
            if let Some(Value::Array(required)) = get(&object, "required") {
                let present: Vec<Value> = required
                    .iter()
                    .filter(|r| {
                        r.as_str()
                            .is_some_and(|r| out["properties"].get(r).is_some())
                    })
                    .cloned()
                    .collect();
                if !present.is_empty() {
                    out.insert("required".into(), Value::Array(present));
                }
            }
            kind.get_or_insert_with(|| "object".into());
        } else if let Some(additional) = get(&object, "additionalProperties") {
            match additional {
                Value::Object(_) => {
                    out.insert(
                        "additionalProperties".into(),
                        self.structural(additional, stack, depth + 1),
                    );
                }
                Value::Bool(true) => {
                    out.insert("x-kubernetes-preserve-unknown-fields".into(), json!(true));
                }
                _ => {}
            }
            kind.get_or_insert_with(|| "object".into());
        }
        if let Some(items) = get(&object, "items") {
            let items = match items {
                Value::Array(tuple) => tuple
                    .first()
                    .map(|i| self.structural(i, stack, depth + 1))
                    .unwrap_or_else(open),
                single => self.structural(single, stack, depth + 1),
            };
            out.insert("items".into(), items);
            kind.get_or_insert_with(|| "array".into());
        }
        match kind.as_deref() {
            Some("array") if !out.contains_key("items") => {
                out.insert("items".into(), open());
            }
            Some("null") => kind = None,
            _ => {}
        }
        match kind {
            Some(kind)
                if ["object", "array", "string", "integer", "number", "boolean"]
                    .contains(&kind.as_str()) =>
            {
                // Formats belong to strings and numbers only.
                if !["string", "integer", "number"].contains(&kind.as_str()) {
                    out.remove("format");
                }
                out.insert("type".into(), json!(kind));
            }
            _ if out.contains_key("x-kubernetes-int-or-string") => {}
            _ => {
                // No usable type: accept anything here rather than produce an invalid schema.
                let description = out.remove("description");
                out = open().as_object().cloned().unwrap_or_default();
                if let Some(d) = description {
                    out.insert("description".into(), d);
                }
            }
        }
        // Children only where the type has them.
        let typed = out.get("type").and_then(Value::as_str).map(str::to_owned);
        if typed.as_deref() != Some("array") {
            out.remove("items");
        }
        if typed.as_deref() != Some("object") {
            for key in ["properties", "additionalProperties", "required"] {
                out.remove(key);
            }
        }
        if out.get("type") == Some(&json!("object"))
            && !out.contains_key("properties")
            && !out.contains_key("additionalProperties")
        {
            out.insert("x-kubernetes-preserve-unknown-fields".into(), json!(true));
        }
        // Enum values must match the type; drop an enum that does not.
        if let Some(Value::Array(values)) = out.get("enum")
            && !values
                .iter()
                .all(|v| matches_type(v, out.get("type").and_then(Value::as_str)))
        {
            out.remove("enum");
        }
        Value::Object(out)
    }
}

fn matches_type(value: &Value, kind: Option<&str>) -> bool {
    match kind {
        Some("string") => value.is_string(),
        Some("integer") => value.is_i64() || value.is_u64(),
        Some("number") => value.is_number(),
        Some("boolean") => value.is_boolean(),
        _ => false,
    }
}

fn merge_into(target: &mut Node<'_>, source: Map<String, Value>) {
    for (key, value) in source {
        match (target.get_mut(key.as_str()), value) {
            (Some(existing), Value::Object(more))
                if key == "properties" && existing.is_object() =>
            {
                if let Value::Object(existing) = existing.to_mut() {
                    existing.extend(more);
                }
            }
            (Some(existing), Value::Array(more)) if key == "required" && existing.is_array() => {
                if let Value::Array(existing) = existing.to_mut() {
                    existing.extend(more);
                }
            }
            (Some(_), _) => {}
            (None, value) => {
                target.insert(Cow::Owned(key), Cow::Owned(value));
            }
        }
    }
}

/// The component schema of (group, version, kind) in an OpenAPI v3 document.
pub fn find_schema<'d>(
    document: &'d Value,
    group: &str,
    version: &str,
    kind: &str,
) -> Option<&'d Value> {
    document["components"]["schemas"]
        .as_object()?
        .values()
        .find(|schema| {
            schema["x-kubernetes-group-version-kind"]
                .as_array()
                .is_some_and(|gvks| {
                    gvks.iter().any(|g| {
                        g["group"] == group && g["version"] == version && g["kind"] == kind
                    })
                })
        })
}

/// OAPI-4, improved: the structural top-level schema for a component schema, or why it cannot be
/// synthesized within [`MAX_SCHEMA_NODES`] and [`MAX_REF_CHAIN`].
pub fn top_level_schema(document: &Value, schema: &Value) -> Result<Value, String> {
    top_level_schema_within(document, schema, &Budget::new(MAX_SCHEMA_NODES))
}

/// [`top_level_schema`], spending its nodes from a discovery's `budget` (what is left of it
/// bounds this schema too).
pub fn top_level_schema_within(
    document: &Value,
    schema: &Value,
    budget: &Budget,
) -> Result<Value, String> {
    let allowed = MAX_SCHEMA_NODES.min(budget.left());
    let discovery_spent = || {
        format!(
            "the provider's OpenAPI documents expand to more than {MAX_DISCOVERY_NODES} schema nodes in one discovery"
        )
    };
    if allowed == 0 {
        return Err(discovery_spent());
    }
    let empty = Map::new();
    let components = document["components"]["schemas"]
        .as_object()
        .unwrap_or(&empty);
    let resolver = Resolver {
        components,
        budget: std::cell::Cell::new(allowed),
        exceeded: std::cell::RefCell::new(None),
        memo: std::cell::RefCell::default(),
        cuts: std::cell::Cell::new(0),
        deepest: std::cell::Cell::new(0),
    };
    let mut top = resolver.structural(schema, &mut Vec::new(), 0);
    let used = allowed - resolver.budget.get();
    budget.spend(used);
    if let Some(why) = resolver.exceeded.into_inner() {
        // Out of the discovery's nodes rather than this schema's own.
        if used == allowed && allowed < MAX_SCHEMA_NODES {
            return Err(discovery_spent());
        }
        return Err(why);
    }
    if let Value::Object(object) = &mut top {
        object.insert("type".into(), json!("object"));
        if let Some(Value::Object(properties)) = object.get_mut("properties") {
            for key in ["apiVersion", "kind", "metadata"] {
                properties.remove(key);
            }
            object.remove("x-kubernetes-preserve-unknown-fields");
            if let Some(Value::Array(required)) = object.get_mut("required") {
                required
                    .retain(|r| !matches!(r.as_str(), Some("apiVersion" | "kind" | "metadata")));
            }
        } else {
            object.insert("x-kubernetes-preserve-unknown-fields".into(), json!(true));
        }
        if object
            .get("required")
            .is_some_and(|r| r.as_array().is_some_and(Vec::is_empty))
        {
            object.remove("required");
        }
    }
    Ok(top)
}

/// OAPI-5/OAPI-6: one CRD for `<resource>.<group>` from every discovered version. `preferred` is
/// discovery's preferred version of the group. `Ok(None)` when no version has a schema; an error
/// names the version whose schema exceeds kbind's bounds.
pub fn synthesize(
    group: &str,
    resource: &str,
    preferred: Option<&str>,
    versions: &[DiscoveredVersion],
) -> Result<Option<CustomResourceDefinition>, String> {
    let budget = Budget::new(MAX_DISCOVERY_NODES);
    synthesize_within(group, resource, preferred, versions, &budget)
}

/// [`synthesize`] within a discovery's node `budget`.
pub fn synthesize_within(
    group: &str,
    resource: &str,
    preferred: Option<&str>,
    versions: &[DiscoveredVersion],
    budget: &Budget,
) -> Result<Option<CustomResourceDefinition>, String> {
    let mut with_schema: Vec<(&DiscoveredVersion, Value)> = Vec::new();
    for v in versions {
        let Some(schema) = find_schema(&v.document, group, &v.version, &v.kind) else {
            continue;
        };
        let schema = top_level_schema_within(&v.document, schema, budget)
            .map_err(|why| format!("version {}: {why}", v.version))?;
        // Defensive: a schema the API server would reject is never offered.
        if is_structural(&schema) {
            with_schema.push((v, schema));
        }
    }
    if with_schema.is_empty() {
        return Ok(None);
    }
    with_schema.sort_by_key(|(v, _)| std::cmp::Reverse(Version::parse(&v.version).priority()));
    let storage = with_schema
        .iter()
        .position(|(v, _)| Some(v.version.as_str()) == preferred)
        .unwrap_or(0);
    let names_from = with_schema[storage].0;
    let crd_versions = with_schema
        .iter()
        .enumerate()
        .map(|(i, (v, schema))| CustomResourceDefinitionVersion {
            name: v.version.clone(),
            served: true,
            storage: i == storage,
            schema: Some(CustomResourceValidation {
                open_api_v3_schema: serde_json::from_value(schema.clone()).ok(),
            }),
            subresources: v.has_status.then(|| CustomResourceSubresources {
                status: Some(CustomResourceSubresourceStatus(json!({}))),
                scale: None,
            }),
            ..Default::default()
        })
        .collect();
    let some = |list: &Vec<String>| (!list.is_empty()).then(|| list.clone());
    Ok(Some(CustomResourceDefinition {
        metadata: ObjectMeta {
            name: Some(format!("{resource}.{group}")),
            ..Default::default()
        },
        spec: CustomResourceDefinitionSpec {
            group: group.to_owned(),
            names: CustomResourceDefinitionNames {
                plural: resource.to_owned(),
                singular: Some(if names_from.singular.is_empty() {
                    names_from.kind.to_lowercase()
                } else {
                    names_from.singular.clone()
                }),
                kind: names_from.kind.clone(),
                list_kind: Some(format!("{}List", names_from.kind)),
                short_names: some(&names_from.short_names),
                categories: some(&names_from.categories),
            },
            scope: if names_from.namespaced {
                "Namespaced".into()
            } else {
                "Cluster".into()
            },
            versions: crd_versions,
            conversion: Some(CustomResourceConversion {
                strategy: "None".into(),
                webhook: None,
            }),
            preserve_unknown_fields: None,
        },
        status: None,
    }))
}

/// Whether a schema node is structural in the sense the API server enforces: every node has a
/// type (or int-or-string, or preserves unknown fields), no `$ref`, and properties and
/// additionalProperties are not both set.
pub fn is_structural(node: &Value) -> bool {
    let Value::Object(object) = node else {
        return false;
    };
    if object.contains_key("$ref")
        || ["allOf", "anyOf", "oneOf", "not"]
            .iter()
            .any(|k| object.contains_key(*k))
    {
        return false;
    }
    let typed = object.get("type").is_some_and(Value::is_string)
        || object.get("x-kubernetes-int-or-string") == Some(&json!(true))
        || object.get("x-kubernetes-preserve-unknown-fields") == Some(&json!(true));
    if !typed || (object.contains_key("properties") && object.contains_key("additionalProperties"))
    {
        return false;
    }
    let kind = object.get("type").and_then(Value::as_str);
    if (kind == Some("array")) != object.contains_key("items") {
        return false;
    }
    if kind != Some("object")
        && ["properties", "additionalProperties", "required"]
            .iter()
            .any(|k| object.contains_key(*k))
    {
        return false;
    }
    object
        .get("properties")
        .and_then(Value::as_object)
        .is_none_or(|p| p.values().all(is_structural))
        && object.get("items").is_none_or(is_structural)
        && object.get("additionalProperties").is_none_or(is_structural)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn document(schemas: Value) -> Value {
        json!({ "components": { "schemas": schemas } })
    }

    fn widget_document(spec: Value) -> Value {
        document(json!({
            "org.example.v1.Widget": {
                "type": "object",
                "x-kubernetes-group-version-kind": [{ "group": "example.org", "version": "v1", "kind": "Widget" }],
                "properties": {
                    "apiVersion": { "type": "string" },
                    "kind": { "type": "string" },
                    "metadata": { "allOf": [{ "$ref": "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta" }] },
                    "spec": spec,
                },
            },
            "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta": { "type": "object", "properties": { "name": { "type": "string" } } },
            "org.example.v1.Size": { "type": "integer", "format": "int32", "minimum": 1 },
            "org.example.v1.Node": { "type": "object", "properties": { "children": { "type": "array", "items": { "$ref": "#/components/schemas/org.example.v1.Node" } }, "name": { "type": "string" } } },
        }))
    }

    fn top(spec: Value) -> Value {
        let doc = widget_document(spec);
        let schema = find_schema(&doc, "example.org", "v1", "Widget")
            .unwrap()
            .clone();
        top_level_schema(&doc, &schema).unwrap()
    }

    #[test]
    fn a_component_expanded_once_is_reused_only_where_it_is_the_same() {
        // #32.9: components are memoized, but never one whose form depends on where it is used
        // (a cycle cut against the referencing stack, or the depth bound).
        let a = json!({ "type": "object", "properties": { "b": { "$ref": "#/components/schemas/B" } } });
        let b = json!({ "type": "object", "properties": { "a": { "$ref": "#/components/schemas/A" } } });
        let leaf = json!({ "type": "object", "properties": { "n": { "type": "string" } } });
        let doc = json!({ "components": { "schemas": { "A": a, "B": b, "Leaf": leaf } } });
        let reference = |name: &str| json!({ "$ref": format!("#/components/schemas/{name}") });
        let schema = json!({ "type": "object", "properties": {
            "x": reference("A"), "y": reference("B"), "l1": reference("Leaf"), "l2": reference("Leaf"),
        } });
        let t = top_level_schema(&doc, &schema).unwrap();
        let open = super::open();
        // B inside A was cut at A; B on its own expands A once more.
        assert_eq!(
            t["properties"]["x"]["properties"]["b"]["properties"]["a"],
            open
        );
        assert_eq!(
            t["properties"]["y"]["properties"]["a"]["properties"]["b"], open,
            "{t}"
        );
        assert_eq!(
            t["properties"]["y"]["properties"]["a"]["properties"]
                .as_object()
                .map(|p| p.len()),
            Some(1)
        );
        assert_eq!(t["properties"]["l1"], t["properties"]["l2"]);
        assert_eq!(
            t["properties"]["l1"]["properties"]["n"],
            json!({ "type": "string" })
        );
        // A chain of components nested near the depth bound: the same component referenced
        // shallow and deep is cut only where it is deep.
        let mut schemas = Map::new();
        schemas.insert("D0".into(), json!({ "type": "string" }));
        for i in 1..=MAX_DEPTH {
            schemas.insert(
                format!("D{i}"),
                json!({ "type": "object", "properties": { "d": reference(&format!("D{}", i - 1)) } }),
            );
        }
        let doc = json!({ "components": { "schemas": schemas } });
        let schema = json!({ "type": "object", "properties": {
            // Expanded first (keys are sorted), and memoized: no cut below it.
            "a_shallow": reference(&format!("D{}", MAX_DEPTH / 2)),
            // Reaches the same component deeper, where its bottom is past the bound.
            "b_deep": reference(&format!("D{MAX_DEPTH}")),
        } });
        let t = top_level_schema(&doc, &schema).unwrap();
        let innermost = |mut node: &Value| {
            let mut levels = 0;
            while let Some(next) = node["properties"].get("d") {
                node = next;
                levels += 1;
            }
            (levels, node.clone())
        };
        assert_eq!(
            innermost(&t["properties"]["a_shallow"]),
            (MAX_DEPTH / 2, json!({ "type": "string" }))
        );
        // Depth 1 + 64 `d`s: the string at the bottom is past the bound, an open object.
        let (levels, last) = innermost(&t["properties"]["b_deep"]);
        assert_eq!((levels, last), (MAX_DEPTH, open));
        assert!(is_structural(&t));
    }

    #[test]
    fn refs_are_resolved_fully_not_replaced() {
        // LIM-5
        let t = top(
            json!({ "type": "object", "properties": { "size": { "$ref": "#/components/schemas/org.example.v1.Size" } } }),
        );
        assert_eq!(
            t["properties"]["spec"]["properties"]["size"],
            json!({ "type": "integer", "format": "int32", "minimum": 1 })
        );
        assert!(
            t["properties"].get("metadata").is_none()
                && t["properties"].get("apiVersion").is_none()
        );
        assert!(is_structural(&t));
    }

    #[test]
    fn only_a_genuine_cycle_becomes_an_open_object() {
        let t = top(json!({ "$ref": "#/components/schemas/org.example.v1.Node" }));
        let node = &t["properties"]["spec"];
        assert_eq!(node["properties"]["name"]["type"], "string");
        assert_eq!(node["properties"]["children"]["type"], "array");
        assert_eq!(
            node["properties"]["children"]["items"],
            open(),
            "the recursive reference"
        );
        assert!(is_structural(&t));
    }

    #[test]
    fn composition_keywords_are_descended_into() {
        // QRK-24
        let t = top(json!({
            "type": "object",
            "properties": {
                "merged": { "allOf": [{ "$ref": "#/components/schemas/org.example.v1.Size" }], "description": "d" },
                "either": { "anyOf": [{ "type": "integer" }, { "type": "string" }] },
                "labels": { "type": "object", "additionalProperties": { "$ref": "#/components/schemas/org.example.v1.Size" } },
                "odd": { "format": "made-up" },
                "missing": { "$ref": "#/components/schemas/nope" },
            },
            "required": ["merged", "absent"],
        }));
        let spec = &t["properties"]["spec"];
        assert_eq!(spec["properties"]["merged"]["type"], "integer");
        assert_eq!(spec["properties"]["merged"]["description"], "d");
        assert_eq!(
            spec["properties"]["either"]["x-kubernetes-int-or-string"],
            true
        );
        assert_eq!(
            spec["properties"]["labels"]["additionalProperties"]["type"],
            "integer"
        );
        assert_eq!(spec["properties"]["odd"], open());
        assert_eq!(spec["properties"]["missing"], open());
        assert_eq!(
            spec["required"],
            json!(["merged"]),
            "required names that do not exist are dropped"
        );
        assert!(is_structural(&t));
    }

    #[test]
    fn versions_merge_into_one_crd_with_the_preferred_storage_version() {
        // OAPI-5, PGAP-13
        let version = |v: &str| DiscoveredVersion {
            version: v.into(),
            kind: "Widget".into(),
            singular: String::new(),
            namespaced: true,
            has_status: v == "v1",
            short_names: vec!["wd".into()],
            categories: vec!["all".into()],
            document: {
                let mut d = widget_document(json!({ "type": "object" }));
                d["components"]["schemas"]["org.example.v1.Widget"]["x-kubernetes-group-version-kind"]
                    [0]["version"] = json!(v);
                std::sync::Arc::new(d)
            },
        };
        let crd = synthesize(
            "example.org",
            "widgets",
            Some("v1"),
            &[version("v1alpha1"), version("v1"), version("v2")],
        )
        .unwrap()
        .unwrap();
        let versions: Vec<(&str, bool)> = crd
            .spec
            .versions
            .iter()
            .map(|v| (v.name.as_str(), v.storage))
            .collect();
        assert_eq!(versions, [("v2", false), ("v1", true), ("v1alpha1", false)]);
        assert_eq!(crd.spec.names.short_names, Some(vec!["wd".into()]));
        assert_eq!(crd.spec.names.singular.as_deref(), Some("widget"));
        assert!(crd.spec.versions[1].subresources.is_some());
        assert_eq!(crd.metadata.name.as_deref(), Some("widgets.example.org"));
    }

    #[test]
    fn duplicate_gvks_a_preserving_root_and_fifty_versions_are_handled() {
        // Two components claim the same GVK: one is used, the result is structural.
        let mut doc = widget_document(json!({ "type": "object" }));
        let twin = doc["components"]["schemas"]["org.example.v1.Widget"].clone();
        doc["components"]["schemas"]["org.example.v1.WidgetTwin"] = twin;
        let schema = find_schema(&doc, "example.org", "v1", "Widget")
            .unwrap()
            .clone();
        assert!(is_structural(&top_level_schema(&doc, &schema).unwrap()));
        // x-kubernetes-preserve-unknown-fields at the root: accepted as an open object.
        let open_root = json!({ "components": { "schemas": { "W": {
            "x-kubernetes-group-version-kind": [{ "group": "example.org", "version": "v1", "kind": "Widget" }],
            "type": "object", "x-kubernetes-preserve-unknown-fields": true,
        }}}});
        let schema = find_schema(&open_root, "example.org", "v1", "Widget")
            .unwrap()
            .clone();
        let top = top_level_schema(&open_root, &schema).unwrap();
        assert!(is_structural(&top));
        assert_eq!(top["x-kubernetes-preserve-unknown-fields"], json!(true));
        // Fifty versions: one CRD, every version served, exactly one stored.
        let versions: Vec<DiscoveredVersion> = (1..=50)
            .map(|n| {
                let v = format!("v{n}");
                let mut d = widget_document(json!({ "type": "object" }));
                d["components"]["schemas"]["org.example.v1.Widget"]["x-kubernetes-group-version-kind"][0]["version"] = json!(v);
                DiscoveredVersion {
                    version: v,
                    kind: "Widget".into(),
                    singular: String::new(),
                    namespaced: true,
                    has_status: false,
                    short_names: Vec::new(),
                    categories: Vec::new(),
                    document: std::sync::Arc::new(d),
                }
            })
            .collect();
        let crd = synthesize("example.org", "widgets", Some("v7"), &versions)
            .unwrap()
            .unwrap();
        assert_eq!(crd.spec.versions.len(), 50);
        let stored: Vec<&str> = crd
            .spec
            .versions
            .iter()
            .filter(|v| v.storage)
            .map(|v| v.name.as_str())
            .collect();
        assert_eq!(stored, ["v7"]);
    }

    /// A document whose Widget spec is `{ "$ref": first }` over `components`.
    fn hostile(components: Map<String, Value>, first: &str) -> Value {
        let mut doc = widget_document(json!({ "$ref": format!("#/components/schemas/{first}") }));
        if let Some(schemas) = doc["components"]["schemas"].as_object_mut() {
            schemas.extend(components);
        }
        doc
    }

    fn synthesize_top(doc: &Value) -> Result<Value, String> {
        let schema = find_schema(doc, "example.org", "v1", "Widget")
            .unwrap()
            .clone();
        top_level_schema(doc, &schema)
    }

    #[test]
    fn exponential_fan_out_stops_at_the_node_budget_quickly() {
        // 40 components, each referencing the next one twice: ~2^40 nodes if expanded.
        let mut components = Map::new();
        for i in 0..40 {
            let next = json!({ "$ref": format!("#/components/schemas/c{}", i + 1) });
            components.insert(
                format!("c{i}"),
                json!({ "type": "object", "properties": { "a": next.clone(), "b": next } }),
            );
        }
        components.insert("c40".into(), json!({ "type": "string" }));
        let started = std::time::Instant::now();
        let err = synthesize_top(&hostile(components, "c0")).unwrap_err();
        assert!(err.contains("more than 100000 nodes"), "{err}");
        // Bounded work: the budget, not the document, decides how long this takes.
        assert!(started.elapsed() < std::time::Duration::from_secs(20));
    }

    #[test]
    fn one_discovery_spends_a_bounded_number_of_nodes_over_all_its_apis() {
        // #32.9: a component of 15 levels, each referencing the next twice (~2^16 = 65,536 nodes,
        // under the per-schema bound), used by 60 resources: ~3.9 million nodes without a
        // discovery budget. The budget stops the discovery at MAX_DISCOVERY_NODES.
        let mut components = Map::new();
        for i in 0..15 {
            let next = json!({ "$ref": format!("#/components/schemas/c{}", i + 1) });
            components.insert(
                format!("c{i}"),
                json!({ "type": "object", "properties": { "a": next.clone(), "b": next } }),
            );
        }
        components.insert("c15".into(), json!({ "type": "string" }));
        let document = hostile(components, "c0");
        let schema = find_schema(&document, "example.org", "v1", "Widget")
            .unwrap()
            .clone();
        let budget = Budget::new(MAX_DISCOVERY_NODES);
        let (mut built, mut refused) = (0, 0);
        for _ in 0..60 {
            match top_level_schema_within(&document, &schema, &budget) {
                Ok(_) => built += 1,
                Err(why) => {
                    assert!(why.contains("in one discovery"), "{why}");
                    refused += 1;
                }
            }
        }
        assert!((20..40).contains(&built), "{built} built");
        assert_eq!(built + refused, 60);
        assert_eq!(budget.left(), 0);
        // Alone, one such schema is fine.
        assert!(top_level_schema(&document, &schema).is_ok());
    }

    #[test]
    fn a_fifty_thousand_ref_chain_neither_overflows_the_stack_nor_passes() {
        let mut components = Map::new();
        for i in 0..50_000 {
            components.insert(
                format!("c{i}"),
                json!({ "$ref": format!("#/components/schemas/c{}", i + 1) }),
            );
        }
        components.insert("c50000".into(), json!({ "type": "string" }));
        let err = synthesize_top(&hostile(components, "c0")).unwrap_err();
        assert!(err.contains("$ref chain longer than 64"), "{err}");
    }

    #[test]
    fn a_short_ref_chain_and_a_cycle_still_synthesize() {
        let mut components = Map::new();
        for i in 0..10 {
            components.insert(
                format!("c{i}"),
                json!({ "$ref": format!("#/components/schemas/c{}", i + 1), "description": format!("level {i}") }),
            );
        }
        components.insert(
            "c10".into(),
            json!({ "type": "object", "properties": { "x": { "type": "string" } } }),
        );
        let top = synthesize_top(&hostile(components, "c0")).unwrap();
        let spec = &top["properties"]["spec"];
        assert_eq!(spec["properties"]["x"]["type"], "string");
        assert_eq!(spec["description"], "level 0", "the outer node's keys win");
        // A self-reference is a cycle: it becomes an open object, not an error.
        let mut cyclic = Map::new();
        cyclic.insert(
            "loop".into(),
            json!({ "type": "object", "properties": { "again": { "$ref": "#/components/schemas/loop" } } }),
        );
        let top = synthesize_top(&hostile(cyclic, "loop")).unwrap();
        assert!(is_structural(&top));
    }
}

#[cfg(test)]
mod fuzz {
    //! Property tests of the synthesis: arbitrary OpenAPI schemas, with references between
    //! components, cycles and missing targets, never panic and always yield a structural schema
    //! (or a named bound). Longer: `PROPTEST_CASES=20000 cargo test --release -p
    //! kbind-schema-manager openapi::synthesis::fuzz`.
    use super::*;
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaProps;
    use proptest::prelude::*;

    fn leaf() -> impl Strategy<Value = Value> {
        prop_oneof![
            prop::sample::select(vec![
                "object", "array", "string", "integer", "number", "boolean", "null", "weird"
            ])
            .prop_map(|t| json!({ "type": t })),
            prop::sample::select(vec!["A", "B", "C", "missing"])
                .prop_map(|n| json!({ "$ref": format!("#/components/schemas/{n}") })),
            prop::sample::select(vec!["int32", "date-time", "made-up", "quantity"])
                .prop_map(|f| json!({ "type": "string", "format": f })),
            Just(json!({})),
            Just(json!({ "type": "string", "enum": ["a", "b"] })),
            Just(json!({ "type": "integer", "enum": ["not-an-integer"] })),
            Just(json!(true)),
        ]
    }

    fn schema() -> impl Strategy<Value = Value> {
        leaf().prop_recursive(5, 64, 4, |inner| {
            prop_oneof![
                prop::collection::btree_map("[a-d]", inner.clone(), 0..4)
                    .prop_map(|p| json!({ "type": "object", "properties": p, "required": ["a", "zz"] })),
                prop::collection::btree_map("[a-d]", inner.clone(), 0..3).prop_map(|p| json!({ "properties": p })),
                inner.clone().prop_map(|i| json!({ "type": "array", "items": i })),
                inner.clone().prop_map(|i| json!({ "items": [i] })),
                prop::collection::vec(inner.clone(), 1..3).prop_map(|b| json!({ "allOf": b })),
                prop::collection::vec(inner.clone(), 1..3).prop_map(|b| json!({ "anyOf": b })),
                prop::collection::vec(inner.clone(), 1..3).prop_map(|b| json!({ "oneOf": b, "type": "object" })),
                inner.clone().prop_map(|i| json!({ "not": i, "type": "string" })),
                inner.clone().prop_map(|i| json!({ "type": "object", "additionalProperties": i })),
                inner.clone().prop_map(|i| json!({ "$ref": "#/components/schemas/A", "description": "with a sibling", "items": i })),
            ]
        })
    }

    proptest! {
        // 512 cases in `cargo test`; PROPTEST_CASES=<n> runs longer.
        #![proptest_config(ProptestConfig {
            cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(512),
            ..ProptestConfig::default()
        })]

        #[test]
        fn synthesis_never_panics_and_is_always_structural(a in schema(), b in schema(), c in schema(), spec in schema()) {
            let document = json!({ "components": { "schemas": {
                "A": a, "B": b, "C": c,
                "W": { "type": "object", "x-kubernetes-group-version-kind": [{ "group": "g.io", "version": "v1", "kind": "W" }],
                       "properties": { "spec": spec, "metadata": { "$ref": "#/components/schemas/A" } } },
            }}});
            let schema = find_schema(&document, "g.io", "v1", "W").unwrap().clone();
            // Within the generator's sizes the bounds are never reached; if they were, the error
            // names them.
            let top = match top_level_schema(&document, &schema) {
                Ok(top) => top,
                Err(why) => {
                    prop_assert!(why.contains("more than") || why.contains("chain"), "{why}");
                    return Ok(());
                }
            };
            prop_assert!(is_structural(&top), "not structural: {top}");
            prop_assert!(serde_json::from_value::<JSONSchemaProps>(top.clone()).is_ok(), "not a CRD schema: {top}");
            prop_assert!(!top.to_string().contains("$ref"));
        }
    }
}
