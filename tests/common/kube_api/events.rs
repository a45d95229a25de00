//! `core/v1` and `events.k8s.io/v1` Events are one resource in kube-apiserver, stored once and
//! converted on read: a list of either kind holds the Events written through both APIs. This
//! converts between the two shapes (`involvedObject` ↔ `regarding`, `message` ↔ `note`,
//! `source.component`/`reportingComponent` ↔ `reportingController`, the `deprecated*`
//! timestamps and count). Watches of one kind do not see writes of the other.

use serde_json::{Map, Value, json};

/// Field renames between core/v1 (left) and events.k8s.io/v1 (right).
const RENAMES: [(&str, &str); 6] = [
    ("involvedObject", "regarding"),
    ("message", "note"),
    ("reportingComponent", "reportingController"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
];
/// Fields both shapes share.
const SHARED: [&str; 8] = [
    "metadata",
    "reason",
    "type",
    "action",
    "related",
    "eventTime",
    "series",
    "reportingInstance",
];

fn copy(
    from: &Value,
    pairs: impl Iterator<Item = (&'static str, &'static str)>,
) -> Map<String, Value> {
    let mut out = Map::new();
    for (src, dst) in pairs {
        if let Some(v) = from.get(src).filter(|v| !v.is_null()) {
            out.insert(dst.to_string(), v.clone());
        }
    }
    out
}

/// An events.k8s.io/v1 Event as core/v1 shows it.
pub fn to_core(event: &Value) -> Value {
    let mut out = copy(event, SHARED.iter().map(|s| (*s, *s)));
    out.extend(copy(event, RENAMES.iter().map(|(core, ev)| (*ev, *core))));
    if let Some(source) = event.get("deprecatedSource") {
        out.insert("source".into(), source.clone());
    } else if let Some(component) = event.get("reportingController") {
        out.insert("source".into(), json!({"component": component}));
    }
    out.insert("apiVersion".into(), json!("v1"));
    out.insert("kind".into(), json!("Event"));
    Value::Object(out)
}

/// A core/v1 Event as events.k8s.io/v1 shows it.
pub fn to_events(event: &Value) -> Value {
    let mut out = copy(event, SHARED.iter().map(|s| (*s, *s)));
    out.extend(copy(event, RENAMES.iter().map(|(core, ev)| (*core, *ev))));
    if let Some(source) = event.get("source") {
        out.insert("deprecatedSource".into(), source.clone());
    }
    out.insert("apiVersion".into(), json!("events.k8s.io/v1"));
    out.insert("kind".into(), json!("Event"));
    Value::Object(out)
}
