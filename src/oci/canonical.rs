//! Canonical JSON: object keys sorted by byte order, no insignificant white space. Every
//! document kiln writes is serialised once through here, and its digest is taken from those
//! exact bytes. Sorting is done explicitly so the output does not depend on whether some
//! dependency turns on serde_json's `preserve_order` feature.

use serde::Serialize;
use serde_json::Value;

/// Serialises `value` canonically.
///
/// # Errors
/// When `value` cannot be represented as JSON (a map with non-string keys).
pub fn to_vec<T: Serialize>(value: &T) -> serde_json::Result<Vec<u8>> {
    let value = serde_json::to_value(value)?;
    let mut out = Vec::with_capacity(512);
    write_value(&value, &mut out)?;
    Ok(out)
}

fn write_value(value: &Value, out: &mut Vec<u8>) -> serde_json::Result<()> {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push(b'{');
            for (i, (key, val)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                serde_json::to_writer(&mut *out, key)?;
                out.push(b':');
                write_value(val, out)?;
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_value(item, out)?;
            }
            out.push(b']');
        }
        scalar => serde_json::to_writer(&mut *out, scalar)?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_sorted_at_every_depth() {
        let v = serde_json::json!({"b": 1, "a": {"z": [ {"y": 1, "x": 2} ], "c": "s"}});
        assert_eq!(
            to_vec(&v).unwrap(),
            br#"{"a":{"c":"s","z":[{"x":2,"y":1}]},"b":1}"#
        );
    }
}
