//! `metadata.managedFields` entries: reading, ordering and writing them, and the timestamps
//! kube-apiserver puts in them.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use super::fieldset::Set;

/// One `managedFields` entry.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Entry {
    /// The manager name.
    pub(super) manager: String,
    /// `operation: Apply` (else Update).
    pub(super) apply: bool,
    /// The apiVersion of the write.
    pub(super) api_version: String,
    /// When the entry last changed (RFC 3339).
    pub(super) time: Option<String>,
    /// The subresource written, e.g. `status`.
    pub(super) subresource: Option<String>,
    /// The owned fields (`fieldsV1`).
    pub(super) set: Set,
}

impl Entry {
    /// An entry stamped with the current time.
    pub(super) fn new(
        manager: &str,
        apply: bool,
        api_version: &str,
        sub: Option<String>,
        set: Set,
    ) -> Self {
        let (manager, api_version) = (manager.to_owned(), api_version.to_owned());
        let time = Some(now());
        Self {
            manager,
            apply,
            api_version,
            time,
            subresource: sub,
            set,
        }
    }

    /// apimachinery's order: Apply before Update, then time, manager, apiVersion, subresource.
    fn order(&self) -> impl Ord + '_ {
        let Self {
            manager,
            api_version,
            time,
            subresource,
            ..
        } = self;
        (self.operation(), time, manager, api_version, subresource)
    }

    /// The `operation` field: "Apply" or "Update".
    pub(super) fn operation(&self) -> &'static str {
        if self.apply { "Apply" } else { "Update" }
    }

    fn to_json(&self) -> Value {
        let mut entry = json!({
            "manager": self.manager,
            "operation": self.operation(),
            "apiVersion": self.api_version,
        });
        if let Some(time) = &self.time {
            entry["time"] = json!(time);
        }
        entry["fieldsType"] = json!("FieldsV1");
        entry["fieldsV1"] = self.set.to_fields_v1();
        if let Some(sub) = &self.subresource {
            entry["subresource"] = json!(sub);
        }
        entry
    }
}

/// The `managedFields` entries of `obj` (none when absent).
pub(super) fn read_entries(obj: &Value) -> Vec<Entry> {
    let entries = obj
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array);
    let text = |e: &Value, k: &str| e.get(k).and_then(Value::as_str).map(str::to_owned);
    (entries.into_iter().flatten())
        .map(|e| Entry {
            manager: text(e, "manager").unwrap_or_default(),
            apply: e.get("operation").and_then(Value::as_str) == Some("Apply"),
            api_version: text(e, "apiVersion").unwrap_or_default(),
            time: text(e, "time"),
            subresource: text(e, "subresource").filter(|s| !s.is_empty()),
            set: Set::from_fields_v1(e.get("fieldsV1").unwrap_or(&Value::Null)),
        })
        .collect()
}

/// Writes `entries` to `obj`'s managedFields, sorted; managers that own nothing are dropped.
pub(super) fn write_entries(obj: &mut Value, mut entries: Vec<Entry>) {
    entries.retain(|e| !e.set.is_empty());
    entries.sort_by(|a, b| a.order().cmp(&b.order()));
    if !obj.is_object() {
        *obj = json!({});
    }
    if !obj["metadata"].is_object() {
        obj["metadata"] = json!({});
    }
    if let Some(meta) = obj["metadata"].as_object_mut() {
        if entries.is_empty() {
            meta.remove("managedFields");
        } else {
            let entries = entries.iter().map(Entry::to_json).collect();
            meta.insert("managedFields".to_owned(), Value::Array(entries));
        }
    }
}

/// The current time as kube-apiserver writes it: RFC 3339, seconds, UTC.
pub(super) fn now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    rfc3339(secs)
}

/// Seconds since the Unix epoch as RFC 3339 in UTC (`1970-01-01T00:00:00Z`).
pub(super) fn rfc3339(secs: u64) -> String {
    // Days to a civil date (Howard Hinnant's algorithm), all in non-negative arithmetic.
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let z = days + 719_468;
    let (era, doe) = (z / 146_097, z % 146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    let (h, m, s) = (rem / 3600, rem % 3600 / 60, rem % 60);
    format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}Z")
}
