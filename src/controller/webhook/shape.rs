//! A review's JSON checked for size in every dimension before anything is built from it:
//! nesting depth and the elements of each array and object. Parsing it into values would
//! otherwise cost far more than its bytes (a 2.8 MB array of a million numbers took the
//! webhook from 15 to 153 MB). The check walks the text once and allocates nothing that
//! grows with it.

use std::fmt;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// Nesting deeper than this is refused; a Function is a few levels deep.
pub const MAX_DEPTH: usize = 64;

/// An array or object with more elements than this is refused; a Function's longest lists
/// (env, secret mounts, labels) hold tens.
pub const MAX_ELEMENTS: usize = 10_000;

/// Checks `body` against [`MAX_DEPTH`] and [`MAX_ELEMENTS`] (and that it is one JSON value).
///
/// # Errors
/// What is too large, and where.
pub fn check(body: &[u8]) -> serde_json::Result<()> {
    let mut reader = serde_json::Deserializer::from_slice(body);
    Shape { depth: 0 }.deserialize(&mut reader)?;
    reader.end()
}

#[derive(Clone, Copy)]
struct Shape {
    depth: usize,
}

impl Shape {
    fn deeper<E: de::Error>(self) -> Result<Shape, E> {
        if self.depth >= MAX_DEPTH {
            return Err(E::custom(format!(
                "nested more than {MAX_DEPTH} levels deep, deeper than any Function"
            )));
        }
        Ok(Shape {
            depth: self.depth + 1,
        })
    }
}

fn too_many<E: de::Error>(what: &str) -> E {
    E::custom(format!(
        "{what} of more than {MAX_ELEMENTS} elements, more than any Function has"
    ))
}

impl<'de> DeserializeSeed<'de> for Shape {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Shape {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let inner = self.deeper()?;
        let mut n = 0usize;
        while seq.next_element_seed(inner)?.is_some() {
            n += 1;
            if n > MAX_ELEMENTS {
                return Err(too_many("an array"));
            }
        }
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let inner = self.deeper()?;
        let mut n = 0usize;
        while map.next_key::<IgnoredAny>()?.is_some() {
            map.next_value_seed(inner)?;
            n += 1;
            if n > MAX_ELEMENTS {
                return Err(too_many("an object"));
            }
        }
        Ok(())
    }
}

/// The fields of `value` its structural `schema` (an OpenAPI v3 schema of the CRD) does not
/// know, as JSON paths under `path`: what kube-apiserver would prune before admission, and no
/// Function needs. Maps (`additionalProperties`) and `x-kubernetes-preserve-unknown-fields`
/// take any key.
pub fn unknown_fields(
    path: &str,
    value: &serde_json::Value,
    schema: &serde_json::Value,
) -> Vec<String> {
    let mut out = Vec::new();
    walk(path, value, schema, &mut out);
    out
}

fn walk(path: &str, value: &serde_json::Value, schema: &serde_json::Value, out: &mut Vec<String>) {
    if schema["x-kubernetes-preserve-unknown-fields"] == true {
        return;
    }
    match value {
        serde_json::Value::Object(fields) => {
            let known = schema["properties"].as_object();
            let map_of = schema.get("additionalProperties").filter(|a| a.is_object());
            for (key, field) in fields {
                let at = format!("{path}.{key}");
                match (known.and_then(|k| k.get(key)), map_of) {
                    (Some(inner), _) | (None, Some(inner)) => walk(&at, field, inner, out),
                    (None, None) if known.is_some() => out.push(at),
                    (None, None) => {}
                }
            }
        }
        serde_json::Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                walk(&format!("{path}[{i}]"), item, &schema["items"], out);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reviews_of_any_real_size_pass_and_what_no_function_needs_is_refused() {
        check(br#"{"a": [1, 2.5, "x", true, null, {"b": []}]}"#).unwrap();
        let wide = format!("[{}0]", "0,".repeat(MAX_ELEMENTS - 1));
        check(wide.as_bytes()).unwrap();
        let wider = format!("[{}0]", "0,".repeat(MAX_ELEMENTS));
        let e = check(wider.as_bytes()).unwrap_err().to_string();
        assert!(e.contains("an array of more than 10000 elements"), "{e}");
        let keys: Vec<String> = (0..=MAX_ELEMENTS).map(|i| format!("\"k{i}\":0")).collect();
        let e = check(format!("{{{}}}", keys.join(",")).as_bytes()).unwrap_err();
        assert!(e.to_string().contains("an object of more than"), "{e}");
        let deep = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        check(deep.as_bytes()).unwrap();
        let deeper = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
        let e = check(deeper.as_bytes()).unwrap_err().to_string();
        assert!(e.contains("nested more than 64 levels"), "{e}");
        assert!(check(b"{} {}").is_err(), "one value only");
        assert!(check(b"{").is_err());
    }

    #[test]
    fn fields_the_schema_does_not_know_are_named_with_their_paths() {
        let schema = serde_json::json!({"properties": {
            "a": {"type": "string"},
            "list": {"items": {"properties": {"x": {}}}},
            "map": {"additionalProperties": {"type": "string"}},
            "free": {"x-kubernetes-preserve-unknown-fields": true}
        }});
        let value = serde_json::json!({
            "a": "1", "b": 2, "list": [{"x": 1, "y": 2}], "map": {"any": "v"},
            "free": {"whatever": [1]}
        });
        assert_eq!(
            unknown_fields("spec", &value, &schema),
            ["spec.b", "spec.list[0].y"]
        );
    }
}
