//! Object metadata as kube-apiserver keeps it: the system fields it owns (uid,
//! creationTimestamp, resourceVersion, generation, managedFields, deletionTimestamp), name and
//! label validation (`ValidateObjectMeta`), and the comparisons behind generation bumps and
//! no-op writes. Pure functions over `serde_json::Value`.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Map, Value, json};

use super::error::Cause;
use super::kinds::{Kind, NameRule};

/// Metadata fields only the server sets; a client's values are replaced by the stored ones.
pub const SYSTEM_FIELDS: [&str; 6] = [
    "uid",
    "creationTimestamp",
    "resourceVersion",
    "generation",
    "managedFields",
    "deletionTimestamp",
];

/// Now, as kube-apiserver writes timestamps (RFC 3339, whole seconds, UTC).
pub fn now() -> String {
    let ts = k8s_openapi::jiff::Timestamp::now();
    ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// `seconds` from now, formatted as [`now`].
pub fn in_seconds(seconds: i64) -> String {
    let ts =
        k8s_openapi::jiff::Timestamp::now() + k8s_openapi::jiff::SignedDuration::from_secs(seconds);
    ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn random_u64() -> u64 {
    // RandomState is seeded randomly per process; a counter makes each value distinct.
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    hasher.finish()
}

/// A random version-4 UUID, like an object's `metadata.uid`.
pub fn new_uid() -> String {
    let (a, b) = (random_u64(), random_u64());
    let hex = format!("{a:016x}{b:016x}");
    format!(
        "{}-{}-4{}-{}{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[13..16],
        ["8", "9", "a", "b"][(b % 4) as usize],
        &hex[17..20],
        &hex[20..32]
    )
}

/// The five-character suffix kube-apiserver appends to a `generateName`.
pub fn name_suffix() -> String {
    // k8s.io/apimachinery/pkg/util/rand: no vowels, no confusable characters.
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut n = random_u64();
    (0..5)
        .map(|_| {
            let c = ALPHABET[(n % ALPHABET.len() as u64) as usize];
            n /= ALPHABET.len() as u64;
            char::from(c)
        })
        .collect()
}

/// `metadata` of an object, created empty if missing or not an object.
pub fn metadata_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    match obj.get_mut("metadata") {
        Some(Value::Object(map)) => map,
        // Just made sure it is an object.
        _ => unreachable!("metadata is an object"),
    }
}

/// A string field of `metadata`.
pub fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")?.get(field)?.as_str()
}

/// `metadata.name`, or the empty string.
pub fn name_of(obj: &Value) -> &str {
    meta_str(obj, "name").unwrap_or_default()
}

/// `metadata.resourceVersion` parsed, or 0.
pub fn rv_of(obj: &Value) -> u64 {
    meta_str(obj, "resourceVersion")
        .and_then(|rv| rv.parse().ok())
        .unwrap_or(0)
}

/// Copies the system fields of `from` into `to` (absent ones are removed from `to`).
pub fn copy_system_fields(from: &Value, to: &mut Value) {
    let source = from.get("metadata").and_then(Value::as_object).cloned();
    let target = metadata_mut(to);
    for field in SYSTEM_FIELDS {
        match source.as_ref().and_then(|m| m.get(field)) {
            Some(v) => target.insert(field.to_string(), v.clone()),
            None => target.remove(field),
        };
    }
}

/// Whether anything outside `metadata` and `status` differs: what bumps `generation`.
pub fn spec_changed(old: &Value, new: &Value) -> bool {
    let strip = |v: &Value| -> Value {
        let mut v = v.clone();
        if let Some(map) = v.as_object_mut() {
            map.remove("metadata");
            map.remove("status");
        }
        v
    };
    strip(old) != strip(new)
}

/// Whether a write changes nothing (the resourceVersion and managedFields timestamps aside):
/// kube-apiserver then skips the write and keeps the resourceVersion.
pub fn same_object(old: &Value, new: &Value) -> bool {
    let strip = |v: &Value| -> Value {
        let mut v = v.clone();
        let meta = metadata_mut(&mut v);
        meta.remove("resourceVersion");
        if let Some(Value::Array(entries)) = meta.get_mut("managedFields") {
            for entry in entries {
                if let Some(e) = entry.as_object_mut() {
                    e.remove("time");
                }
            }
        }
        v
    };
    strip(old) == strip(new)
}

/// A Secret's `stringData` becomes base64 `data` (its keys win), as kube-apiserver stores it.
pub fn fold_string_data(secret: &mut Value) {
    use base64::Engine as _;
    let Some(map) = secret.as_object_mut() else {
        return;
    };
    let Some(Value::Object(strings)) = map.remove("stringData") else {
        return;
    };
    let data = map.entry("data").or_insert_with(|| json!({}));
    for (key, value) in strings {
        let text = value.as_str().unwrap_or_default();
        data[key.as_str()] = json!(base64::engine::general_purpose::STANDARD.encode(text));
    }
}

fn is_label_char(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'
}

fn dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars().all(is_label_char)
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn dns1123_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(dns1123_label)
}

/// Validates `metadata.name` by the kind's rule and the labels' keys and values.
pub fn validate(kind: &Kind, obj: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let name = name_of(obj);
    let (valid, rule) = match kind.names {
        NameRule::Subdomain => (
            dns1123_subdomain(name),
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, \
             '-' or '.', and must start and end with an alphanumeric character",
        ),
        NameRule::Label => (
            dns1123_label(name),
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or \
             '-', and must start and end with an alphanumeric character",
        ),
        NameRule::Label1035 => (
            dns1123_label(name) && name.starts_with(|c: char| c.is_ascii_lowercase()),
            "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start \
             with an alphabetic character, and end with an alphanumeric character",
        ),
    };
    if name.is_empty() {
        causes.push(Cause::new(
            "FieldValueRequired",
            "metadata.name",
            "Required value: name or generateName is required",
        ));
    } else if !valid {
        causes.push(Cause::new(
            "FieldValueInvalid",
            "metadata.name",
            format!("Invalid value: \"{name}\": {rule}"),
        ));
    }
    if let Some(labels) = obj.pointer("/metadata/labels").and_then(Value::as_object) {
        for (key, value) in labels {
            validate_label(key, value, &mut causes);
        }
    }
    causes
}

fn qualified_name(key: &str) -> bool {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    name_ok && prefix.is_none_or(dns1123_subdomain)
}

fn validate_label(key: &str, value: &Value, causes: &mut Vec<Cause>) {
    let field = format!("metadata.labels[{key}]");
    if !qualified_name(key) {
        causes.push(Cause::new(
            "FieldValueInvalid",
            &field,
            format!(
                "Invalid value: \"{key}\": name part must consist of alphanumeric characters, \
                 '-', '_' or '.', and must start and end with an alphanumeric character"
            ),
        ));
    }
    let Some(value) = value.as_str() else {
        causes.push(Cause::new(
            "FieldValueTypeInvalid",
            &field,
            "must be a string",
        ));
        return;
    };
    let value_ok = value.is_empty()
        || (value.len() <= 63
            && value
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            && value.starts_with(|c: char| c.is_ascii_alphanumeric())
            && value.ends_with(|c: char| c.is_ascii_alphanumeric()));
    if !value_ok {
        causes.push(Cause::new(
            "FieldValueInvalid",
            &field,
            format!(
                "Invalid value: \"{value}\": a valid label must be an empty string or consist \
                 of alphanumeric characters, '-', '_' or '.', and must start and end with an \
                 alphanumeric character, at most 63 characters"
            ),
        ));
    }
}
