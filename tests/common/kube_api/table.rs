//! Server-side printing: a `meta.k8s.io/v1` Table for a GET or LIST that asks for one
//! (`Accept: application/json;as=Table;v=v1;g=meta.k8s.io`, what `kubectl get` sends), as
//! kube-apiserver makes it: a CRD's `additionalPrinterColumns` (their JSONPath evaluated,
//! `date` columns as an age like `5m3s`) after `Name`, and `Name`/`Age` for built-in kinds
//! (kube-apiserver's own printers for Pods and Deployments are not modelled). Each row
//! carries the object's metadata as a `PartialObjectMetadata`. JSONPath: the subset CRDs use
//! (`.a.b`, `[n]`, `[*]`, `[?(@.k=='v')]`).

use serde_json::{Value, json};

use super::kinds::Kind;

/// The media type a Table is answered with.
pub const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io";

/// Whether a request's `Accept` asks for a Table.
pub fn wanted(accept: &str) -> bool {
    accept
        .split(',')
        .next()
        .is_some_and(|first| first.contains("as=Table"))
}

/// The media type of one object's metadata alone (kube's `get_metadata`).
pub const PARTIAL: &str = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1";
/// The media type of a list's metadata alone (kube's `list_metadata`).
pub const PARTIAL_LIST: &str = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1";

/// Whether a request's `Accept` asks for metadata alone (`PartialObjectMetadata` or its
/// list; the server answers whichever the path names).
pub fn metadata_wanted(accept: &str) -> bool {
    accept
        .split(',')
        .next()
        .is_some_and(|first| first.contains("as=PartialObjectMetadata"))
}

/// One object's metadata as a `PartialObjectMetadata`.
pub fn partial(object: &Value) -> Value {
    json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
           "metadata": object["metadata"]})
}

/// `objects`' metadata as a `PartialObjectMetadataList` at `resource_version`.
pub fn partial_list(objects: &[Value], resource_version: &str) -> Value {
    json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1",
           "metadata": {"resourceVersion": resource_version},
           "items": objects.iter().map(partial).collect::<Vec<_>>()})
}

/// The Table of `objects` of `kind`, at `resource_version`.
pub fn table(kind: &Kind, objects: &[Value], resource_version: &str) -> Value {
    let mut columns = vec![json!({"name": "Name", "type": "string", "format": "name",
        "description": "Name must be unique within a namespace.", "priority": 0})];
    let custom: Vec<Value> = kind.crd.map(|c| c.columns.clone()).unwrap_or_default();
    if custom.is_empty() {
        columns.push(
            json!({"name": "Age", "type": "date", "format": "", "priority": 0,
            "description": "CreationTimestamp is a timestamp representing the server time when \
                this object was created."}),
        );
    }
    for c in &custom {
        columns.push(json!({
            "name": c["name"], "type": c["type"], "format": c["format"].as_str().unwrap_or(""),
            "description": c["description"].as_str().unwrap_or(""),
            "priority": c["priority"].as_i64().unwrap_or(0),
        }));
    }
    let rows: Vec<Value> = objects
        .iter()
        .map(|obj| {
            let mut cells = vec![obj["metadata"]["name"].clone()];
            if custom.is_empty() {
                cells.push(json!(age(obj["metadata"]["creationTimestamp"].as_str())));
            }
            for c in &custom {
                let path = c["jsonPath"].as_str().unwrap_or_default();
                let found = evaluate(obj, path);
                cells.push(cell(c["type"].as_str().unwrap_or("string"), found));
            }
            json!({"cells": cells, "object": {"kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1", "metadata": partial_metadata(&obj["metadata"])}})
        })
        .collect();
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1",
           "metadata": {"resourceVersion": resource_version},
           "columnDefinitions": columns, "rows": rows})
}

fn partial_metadata(metadata: &Value) -> Value {
    let mut m = metadata.clone();
    if let Some(map) = m.as_object_mut() {
        map.remove("managedFields");
    }
    m
}

/// A cell of a column of `kind_name` from the JSONPath's results (the first one printed).
fn cell(kind_name: &str, found: Vec<Value>) -> Value {
    let Some(first) = found.into_iter().next() else {
        return Value::Null;
    };
    match kind_name {
        "date" => json!(age(first.as_str())),
        "integer" | "number" | "boolean" => first,
        _ => match first {
            Value::String(s) => Value::String(s),
            other => Value::String(other.to_string()),
        },
    }
}

/// An age like kube-apiserver's `duration.HumanDuration` of the time since `timestamp`.
pub fn age(timestamp: Option<&str>) -> String {
    let Some(ts) = timestamp.and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok()) else {
        return "<unknown>".into();
    };
    let seconds = (k8s_openapi::jiff::Timestamp::now().as_second() - ts.as_second()).max(0);
    let (minutes, hours, days) = (seconds / 60, seconds / 3600, seconds / 86400);
    match () {
        () if seconds < 120 => format!("{seconds}s"),
        () if minutes < 10 && seconds % 60 == 0 => format!("{minutes}m"),
        () if minutes < 10 => format!("{minutes}m{}s", seconds % 60),
        () if minutes < 180 => format!("{minutes}m"),
        () if hours < 8 && minutes % 60 == 0 => format!("{hours}h"),
        () if hours < 8 => format!("{hours}h{}m", minutes % 60),
        () if hours < 48 => format!("{hours}h"),
        () if hours < 192 && hours % 24 == 0 => format!("{days}d"),
        () if hours < 192 => format!("{days}d{}h", hours % 24),
        () if days < 730 => format!("{days}d"),
        () => format!("{}y", days / 365),
    }
}

/// The values a JSONPath (`.a.b[?(@.k=='v')].c`, `[n]`, `[*]`) selects in `obj`.
pub fn evaluate(obj: &Value, path: &str) -> Vec<Value> {
    let mut current = vec![obj.clone()];
    let mut rest = path.trim().trim_start_matches('{').trim_end_matches('}');
    rest = rest.strip_prefix('$').unwrap_or(rest);
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix('.') {
            let end = after.find(['.', '[']).unwrap_or(after.len());
            let field = &after[..end];
            current = current
                .iter()
                .filter_map(|v| v.get(field).cloned())
                .collect();
            rest = &after[end..];
        } else if let Some(after) = rest.strip_prefix('[') {
            let Some(end) = after.find(']') else {
                return Vec::new();
            };
            let index = &after[..end];
            current = current.iter().flat_map(|v| select(v, index)).collect();
            rest = &after[end + 1..];
        } else {
            return Vec::new();
        }
    }
    current
}

/// `[*]`, `[n]` or `[?(@.k=='v')]` applied to one value.
fn select(v: &Value, index: &str) -> Vec<Value> {
    let items = v.as_array().cloned().unwrap_or_default();
    if index == "*" {
        return items;
    }
    if let Ok(n) = index.parse::<usize>() {
        return items.get(n).cloned().into_iter().collect();
    }
    let Some(filter) = index.strip_prefix("?(@.").and_then(|f| f.strip_suffix(')')) else {
        return Vec::new();
    };
    let Some((field, value)) = filter.split_once("==") else {
        return Vec::new();
    };
    let value = value.trim().trim_matches(['\'', '"']);
    items
        .into_iter()
        .filter(|item| item.get(field.trim()).and_then(Value::as_str) == Some(value))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::evaluate;
    use serde_json::json;

    #[test]
    fn the_jsonpaths_of_printer_columns_select_as_kubectl_expects() {
        let f = json!({"spec": {"runtime": "nodejs22"}, "metadata": {"generation": 3},
            "status": {"conditions": [{"type": "BuildReady", "status": "True"},
                                      {"type": "Running", "status": "False"}]}});
        assert_eq!(evaluate(&f, ".spec.runtime"), [json!("nodejs22")]);
        assert_eq!(evaluate(&f, ".metadata.generation"), [json!(3)]);
        assert_eq!(
            evaluate(&f, ".status.conditions[?(@.type=='Running')].status"),
            [json!("False")]
        );
        assert_eq!(
            evaluate(&f, ".status.conditions[0].type"),
            [json!("BuildReady")]
        );
        assert!(evaluate(&f, ".status.conditions[?(@.type=='Nope')].status").is_empty());
    }
}
