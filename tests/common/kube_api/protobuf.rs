//! Request bodies in Kubernetes' protobuf encoding, which `kubectl create namespace|secret|
//! configmap|serviceaccount` sends (`application/vnd.kubernetes.protobuf`): the `k8s\0` magic,
//! a `runtime.Unknown` envelope (type meta, raw object), and the object's message, decoded to
//! the JSON the rest of the server works with. Only those kinds' fields that `kubectl create`
//! fills are decoded (metadata name, generateName, namespace, labels, annotations; a
//! Secret's data, stringData, type and immutable; a ConfigMap's data, binaryData and
//! immutable); another kind is a 415, naming it. Answers stay JSON, which kubectl accepts.

use base64::Engine;
use serde_json::{Map, Value, json};

use super::error::Error;

/// The protobuf media type.
pub const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";

/// One field of a message: its number and its bytes (varints as their value's bytes).
enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
}

fn varint(bytes: &[u8], at: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *bytes.get(*at)?;
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

/// The fields of a message, in order.
fn fields(bytes: &[u8]) -> Option<Vec<(u64, Field<'_>)>> {
    let mut at = 0;
    let mut out = Vec::new();
    while at < bytes.len() {
        let key = varint(bytes, &mut at)?;
        let (number, wire) = (key >> 3, key & 7);
        let field = match wire {
            0 => Field::Varint(varint(bytes, &mut at)?),
            2 => {
                let len = usize::try_from(varint(bytes, &mut at)?).ok()?;
                let slice = bytes.get(at..at.checked_add(len)?)?;
                at += len;
                Field::Bytes(slice)
            }
            5 => {
                at += 4;
                continue;
            }
            1 => {
                at += 8;
                continue;
            }
            _ => return None,
        };
        out.push((number, field));
    }
    Some(out)
}

fn text(field: &Field<'_>) -> Option<String> {
    match field {
        Field::Bytes(b) => String::from_utf8(b.to_vec()).ok(),
        Field::Varint(_) => None,
    }
}

/// A `map<string, string|bytes>` entry: (key, value bytes).
fn entry(bytes: &[u8]) -> Option<(String, Vec<u8>)> {
    let mut key = String::new();
    let mut value = Vec::new();
    for (n, f) in fields(bytes)? {
        match (n, &f) {
            (1, _) => key = text(&f)?,
            (2, Field::Bytes(b)) => value = b.to_vec(),
            _ => {}
        }
    }
    Some((key, value))
}

fn put_map(out: &mut Map<String, Value>, name: &str, key: String, value: Value) {
    let map = out.entry(name).or_insert_with(|| Value::Object(Map::new()));
    if let Some(map) = map.as_object_mut() {
        map.insert(key, value);
    }
}

fn object_meta(bytes: &[u8]) -> Option<Value> {
    let mut meta = Map::new();
    for (n, f) in fields(bytes)? {
        match n {
            1 => drop(meta.insert("name".into(), json!(text(&f)?))),
            2 => drop(meta.insert("generateName".into(), json!(text(&f)?))),
            3 => drop(meta.insert("namespace".into(), json!(text(&f)?))),
            11 | 12 => {
                let Field::Bytes(b) = f else { continue };
                let (k, v) = entry(b)?;
                let name = if n == 11 { "labels" } else { "annotations" };
                put_map(&mut meta, name, k, json!(String::from_utf8(v).ok()?));
            }
            _ => {}
        }
    }
    meta.retain(|_, v| v.as_str() != Some(""));
    Some(Value::Object(meta))
}

/// The object in a protobuf request body, as JSON.
///
/// # Errors
/// 400 for bytes that are no Kubernetes protobuf, 415 for a kind it does not decode.
pub fn decode(body: &[u8]) -> Result<Value, Error> {
    let bad = || Error::BadRequest {
        message: "the body of the request could not be decoded as Kubernetes protobuf".into(),
    };
    let envelope = body.strip_prefix(b"k8s\0").ok_or_else(bad)?;
    let (mut api_version, mut kind, mut raw) = (String::new(), String::new(), &[][..]);
    for (n, f) in fields(envelope).ok_or_else(bad)? {
        match (n, f) {
            (1, Field::Bytes(type_meta)) => {
                for (m, g) in fields(type_meta).ok_or_else(bad)? {
                    match m {
                        1 => api_version = text(&g).ok_or_else(bad)?,
                        2 => kind = text(&g).ok_or_else(bad)?,
                        _ => {}
                    }
                }
            }
            (2, Field::Bytes(b)) => raw = b,
            _ => {}
        }
    }
    let mut object = Map::new();
    object.insert("apiVersion".into(), json!(api_version));
    object.insert("kind".into(), json!(kind));
    let supported = ["Namespace", "Secret", "ConfigMap", "ServiceAccount"];
    if api_version != "v1" || !supported.contains(&kind.as_str()) {
        return Err(Error::UnsupportedMediaType {
            content_type: format!("{MEDIA_TYPE} ({api_version} {kind})"),
        });
    }
    let b64 = |v: &[u8]| json!(base64::engine::general_purpose::STANDARD.encode(v));
    for (n, f) in fields(raw).ok_or_else(bad)? {
        let bytes = match &f {
            Field::Bytes(b) => *b,
            Field::Varint(v) => {
                // Secret and ConfigMap `immutable`.
                let immutable = (kind == "Secret" && n == 5) || (kind == "ConfigMap" && n == 4);
                if immutable {
                    object.insert("immutable".into(), json!(*v != 0));
                }
                continue;
            }
        };
        match (kind.as_str(), n) {
            (_, 1) => drop(object.insert("metadata".into(), object_meta(bytes).ok_or_else(bad)?)),
            ("Secret", 2) | ("ConfigMap", 3) => {
                let (k, v) = entry(bytes).ok_or_else(bad)?;
                let field = if kind == "Secret" {
                    "data"
                } else {
                    "binaryData"
                };
                put_map(&mut object, field, k, b64(&v));
            }
            ("Secret", 4) | ("ConfigMap", 2) => {
                let (k, v) = entry(bytes).ok_or_else(bad)?;
                let field = if kind == "Secret" {
                    "stringData"
                } else {
                    "data"
                };
                let text = String::from_utf8(v).map_err(|_| bad())?;
                put_map(&mut object, field, k, json!(text));
            }
            ("Secret", 3) => {
                let t = String::from_utf8(bytes.to_vec()).map_err(|_| bad())?;
                if !t.is_empty() {
                    object.insert("type".into(), json!(t));
                }
            }
            _ => {}
        }
    }
    Ok(Value::Object(object))
}

#[cfg(test)]
mod tests {
    use super::decode;
    use serde_json::json;

    /// What `kubectl create namespace team` sent (captured from kubectl 1.37.1).
    const NAMESPACE: &str = "6b387300 0a0f0a0276311209 4e616d657370616365 \
        121c0a140a047465616d12001a0022002a0032003800420012001a020a00 1a00 2200";

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn kubectls_protobuf_namespace_decodes_to_its_json() {
        assert_eq!(
            decode(&hex(NAMESPACE)).unwrap(),
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}})
        );
        assert!(decode(b"{}").is_err());
    }
}
