//! Validation of custom resources against their CRD, in kube-apiserver's order: prune
//! unknown fields (and `null`s in non-nullable fields), apply `default`s, check the
//! structural rules (type, nullable, required, enum, minimum/maximum, minLength/maxLength,
//! min/maxItems, min/maxProperties, int-or-string), then evaluate the CEL rules
//! (`x-kubernetes-validations`) with the `kube-cel` crate. Not checked: `pattern`, `format`
//! and validation ratcheting of unchanged fields.

use kube_cel::{CompiledSchema, Validator, compile_schema};
use serde_json::{Map, Value};

use super::error::Cause;
use super::kinds::{CrdNames, Kind, Kinds, NameRule};

/// One served version of a CRD, ready to validate objects.
pub struct Crd {
    /// The kind it defines.
    pub kind: &'static Kind,
    /// Shared with every write's field schema ([`Crd::schema`]): the Function CRD's is large,
    /// and a copy per write was a third of the server's time among 500 Functions.
    schema: std::sync::Arc<Value>,
    compiled: CompiledSchema,
    validator: Validator,
}

impl std::fmt::Debug for Crd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Crd")
            .field("kind", &self.kind.qualified_kind())
            .finish()
    }
}

/// The kinds of every served version of a CRD object (JSON), registered in `kinds`, with
/// their validators: what kube-apiserver's apiextensions server does once a CRD is
/// established.
///
/// # Errors
/// A description of what is missing, for an object that is no usable CRD.
pub fn register_crd(crd: &Value, kinds: &mut Kinds) -> Result<Vec<Crd>, String> {
    let group = crd["spec"]["group"]
        .as_str()
        .ok_or("CRD without spec.group")?;
    let names = &crd["spec"]["names"];
    let plural = names["plural"]
        .as_str()
        .ok_or("CRD without spec.names.plural")?;
    let kind_name = names["kind"]
        .as_str()
        .ok_or("CRD without spec.names.kind")?;
    let versions = crd["spec"]["versions"]
        .as_array()
        .ok_or("CRD without versions")?;
    let namespaced = crd["spec"]["scope"] != "Cluster";
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_str().map(str::to_string))
            .collect()
    };
    let leak = |s: &str| -> &'static str { Box::leak(s.to_string().into_boxed_str()) };
    kinds.unregister(group, plural);
    let mut crds = Vec::new();
    for v in versions.iter().filter(|v| v["served"] != false) {
        let version = v["name"].as_str().ok_or("CRD version without a name")?;
        let schema = v["schema"]["openAPIV3Schema"].clone();
        if !schema.is_object() {
            return Err(format!("{plural}.{group}/{version} has no openAPIV3Schema"));
        }
        let scale = &v["subresources"]["scale"];
        let scale_paths = scale.is_object().then(|| {
            [
                "specReplicasPath",
                "statusReplicasPath",
                "labelSelectorPath",
            ]
            .map(|p| scale[p].as_str().unwrap_or_default().to_string())
        });
        let crd_names: &'static CrdNames = Box::leak(Box::new(CrdNames {
            singular: names["singular"]
                .as_str()
                .map_or_else(|| kind_name.to_lowercase(), str::to_string),
            short_names: strings(&names["shortNames"]),
            categories: strings(&names["categories"]),
            columns: v["additionalPrinterColumns"]
                .as_array()
                .cloned()
                .unwrap_or_default(),
            scale_paths,
        }));
        let kind = kinds.register(Kind {
            group: leak(group),
            version: leak(version),
            kind: leak(kind_name),
            plural: leak(plural),
            namespaced,
            status: v["subresources"]["status"].is_object(),
            scale: scale.is_object(),
            custom: true,
            names: NameRule::Subdomain,
            crd: Some(crd_names),
        });
        let compiled = compile_schema(&schema);
        crds.push(Crd {
            kind,
            schema: std::sync::Arc::new(schema),
            compiled,
            validator: Validator::new(),
        });
    }
    Ok(crds)
}

impl Crd {
    /// The served version's `openAPIV3Schema`.
    pub fn schema(&self) -> &std::sync::Arc<Value> {
        &self.schema
    }

    /// The fields of `obj` its schema does not declare (`spec.foo`), which pruning would
    /// drop: what `fieldValidation=Strict` refuses.
    pub fn unknown_fields(&self, obj: &Value) -> Vec<String> {
        let mut found = Vec::new();
        if let Some(map) = obj.as_object() {
            for (key, value) in map {
                if !["apiVersion", "kind", "metadata"].contains(&key.as_str()) {
                    unknown(&self.schema, key, value, key, &mut found);
                }
            }
        }
        found
    }

    /// Prunes unknown fields and applies defaults, as decoding a request does.
    pub fn normalize(&self, obj: &mut Value) {
        prune_root(&self.schema, obj);
        *obj = kube_cel::apply_defaults(&self.schema, obj);
    }

    /// Validates a normalized object (`old` is the stored object on an update, for CEL
    /// transition rules). Returns the field errors, empty when valid.
    pub fn validate(&self, obj: &Value, old: Option<&Value>) -> Vec<Cause> {
        let mut causes = Vec::new();
        check(&self.schema, obj, "", &mut causes);
        if let Err(errors) = self.validator.validate_compiled(&self.compiled, obj, old) {
            for e in errors.iter() {
                let value = lookup(obj, &e.field_path).map_or_else(|| "null".to_string(), describe);
                causes.push(Cause::new(
                    "FieldValueInvalid",
                    e.field_path.clone(),
                    format!("Invalid value: {value}: {}", e.message),
                ));
            }
        }
        causes
    }
}

/// The value at a kube-cel field path such as `spec.env[0].name`.
fn lookup<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    let mut value = obj;
    for segment in path.split('.').filter(|s| !s.is_empty()) {
        let (key, indices) = segment.split_once('[').unwrap_or((segment, ""));
        if !key.is_empty() {
            value = value.get(key)?;
        }
        for index in indices.split('[').filter(|i| !i.is_empty()) {
            value = value.get(index.trim_end_matches(']').parse::<usize>().ok()?)?;
        }
    }
    Some(value)
}

/// A value as kube-apiserver quotes it in "Invalid value: …": the type for objects and lists.
fn describe(value: &Value) -> String {
    match value {
        Value::Object(_) => "\"object\"".to_string(),
        Value::Array(_) => "\"array\"".to_string(),
        other => other.to_string(),
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn nullable(schema: &Value) -> bool {
    schema["nullable"].as_bool() == Some(true)
}

/// At the root, `apiVersion`, `kind` and `metadata` are kept whatever the schema says.
fn prune_root(schema: &Value, obj: &mut Value) {
    let Some(map) = obj.as_object_mut() else {
        return;
    };
    let keep = ["apiVersion", "kind", "metadata"];
    let kept: Vec<(String, Value)> = keep
        .iter()
        .filter_map(|k| map.remove(*k).map(|v| ((*k).to_string(), v)))
        .collect();
    prune_object(schema, map);
    map.extend(kept);
}

fn prune(schema: &Value, value: &mut Value) {
    match value {
        Value::Object(map) => prune_object(schema, map),
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                items.iter_mut().for_each(|item| prune(item_schema, item));
            }
        }
        _ => {}
    }
}

fn prune_object(schema: &Value, map: &mut Map<String, Value>) {
    if schema["x-kubernetes-preserve-unknown-fields"].as_bool() == Some(true) {
        return;
    }
    let props = schema.get("properties").and_then(Value::as_object);
    let additional = schema.get("additionalProperties").filter(|a| a.is_object());
    map.retain(|key, value| {
        let child = props.and_then(|p| p.get(key)).or(additional);
        // Unknown fields are dropped; so are nulls where the schema does not allow them.
        child.is_some_and(|c| !value.is_null() || nullable(c))
    });
    for (key, value) in map.iter_mut() {
        if let Some(child) = props.and_then(|p| p.get(key)).or(additional) {
            prune(child, value);
        }
    }
}

/// Collects the undeclared fields under `key` (at `path`) of an object with `schema`.
fn unknown(schema: &Value, key: &str, value: &Value, path: &str, found: &mut Vec<String>) {
    if schema["x-kubernetes-preserve-unknown-fields"].as_bool() == Some(true) {
        return;
    }
    let child = schema
        .get("properties")
        .and_then(|p| p.get(key))
        .or(schema.get("additionalProperties").filter(|a| a.is_object()));
    let Some(child) = child else {
        found.push(path.to_string());
        return;
    };
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                unknown(child, k, v, &format!("{path}.{k}"), found);
            }
        }
        Value::Array(items) => {
            if let Some(item) = child.get("items") {
                for (i, v) in items.iter().enumerate() {
                    if let Value::Object(map) = v {
                        for (k, v) in map {
                            unknown(item, k, v, &format!("{path}[{i}].{k}"), found);
                        }
                    }
                }
            }
        }
        _ => {}
    }
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn type_matches(expected: &str, value: &Value) -> bool {
    let actual = type_name(value);
    actual == expected || (expected == "number" && actual == "integer")
}

/// The structural checks of one schema node, recursively.
fn check(schema: &Value, value: &Value, path: &str, causes: &mut Vec<Cause>) {
    let invalid = |msg: String| Cause::new("FieldValueInvalid", path, msg);
    if value.is_null() {
        return; // pruned unless nullable
    }
    if schema["x-kubernetes-int-or-string"].as_bool() == Some(true) {
        if !matches!(type_name(value), "integer" | "string") {
            causes.push(Cause::new(
                "FieldValueTypeInvalid",
                path,
                format!(
                    "Invalid value: {}: {path} in body must be of type integer,string: {}",
                    describe(value),
                    describe(value)
                ),
            ));
        }
        return;
    }
    if let Some(expected) = schema["type"].as_str()
        && !type_matches(expected, value)
    {
        let actual = type_name(value);
        causes.push(Cause::new(
            "FieldValueTypeInvalid",
            path,
            format!(
                "Invalid value: \"{actual}\": {path} in body must be of type {expected}: \
                 \"{actual}\""
            ),
        ));
        return;
    }
    if let Some(allowed) = schema["enum"].as_array()
        && !allowed.contains(value)
    {
        let list: Vec<String> = allowed.iter().map(Value::to_string).collect();
        causes.push(Cause::new(
            "FieldValueNotSupported",
            path,
            format!(
                "Unsupported value: {value}: supported values: {}",
                list.join(", ")
            ),
        ));
    }
    let bound = |key: &str| schema[key].as_f64();
    if let Some(n) = value.as_f64() {
        if let Some(min) = bound("minimum").filter(|m| n < *m) {
            causes.push(invalid(format!(
                "Invalid value: {value}: {path} in body should be greater than or equal to {min}"
            )));
        }
        if let Some(max) = bound("maximum").filter(|m| n > *m) {
            causes.push(invalid(format!(
                "Invalid value: {value}: {path} in body should be less than or equal to {max}"
            )));
        }
    }
    let count = |key: &str| schema[key].as_u64().map(|n| n as usize);
    match value {
        Value::String(s) => {
            let chars = s.chars().count();
            if let Some(max) = count("maxLength").filter(|m| chars > *m) {
                causes.push(Cause::new(
                    "FieldValueTooLong",
                    path,
                    format!("Too long: may not be more than {max} bytes"),
                ));
            }
            if let Some(min) = count("minLength").filter(|m| chars < *m) {
                causes.push(invalid(format!(
                    "Invalid value: {value}: {path} in body should be at least {min} chars long"
                )));
            }
        }
        Value::Array(items) => {
            if let Some(max) = count("maxItems").filter(|m| items.len() > *m) {
                causes.push(Cause::new(
                    "FieldValueTooMany",
                    path,
                    format!("Too many: {}: must have at most {max} items", items.len()),
                ));
            }
            if let Some(min) = count("minItems").filter(|m| items.len() < *m) {
                causes.push(invalid(format!(
                    "Invalid value: {}: {path} in body should have at least {min} items",
                    items.len()
                )));
            }
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    check(item_schema, item, &format!("{path}[{i}]"), causes);
                }
            }
        }
        Value::Object(map) => check_object(schema, map, path, causes),
        _ => {}
    }
}

fn check_object(schema: &Value, map: &Map<String, Value>, path: &str, causes: &mut Vec<Cause>) {
    let count = |key: &str| schema[key].as_u64().map(|n| n as usize);
    if let Some(max) = count("maxProperties").filter(|m| map.len() > *m) {
        causes.push(Cause::new(
            "FieldValueTooMany",
            path,
            format!("Too many: {}: must have at most {max} items", map.len()),
        ));
    }
    if let Some(min) = count("minProperties").filter(|m| map.len() < *m) {
        causes.push(Cause::new(
            "FieldValueInvalid",
            path,
            format!(
                "Invalid value: {}: {path} in body should have at least {min} properties",
                map.len()
            ),
        ));
    }
    for required in schema["required"].as_array().into_iter().flatten() {
        if let Some(key) = required.as_str()
            && !map.contains_key(key)
        {
            causes.push(Cause::new(
                "FieldValueRequired",
                join(path, key),
                "Required value",
            ));
        }
    }
    let props = schema.get("properties").and_then(Value::as_object);
    let additional = schema.get("additionalProperties").filter(|a| a.is_object());
    for (key, value) in map {
        if path.is_empty() && matches!(key.as_str(), "apiVersion" | "kind" | "metadata") {
            continue;
        }
        if let Some(child) = props.and_then(|p| p.get(key)) {
            check(child, value, &join(path, key), causes);
        } else if let Some(child) = additional {
            check(child, value, &format!("{path}[{key}]"), causes);
        }
    }
}
