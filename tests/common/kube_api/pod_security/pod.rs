//! The pod as the checks read it: containers flattened in upstream's visiting order, and JSON
//! accessors that read null as an unset field (a nil Go pointer) and a value of the wrong type as
//! Go's zero value.

use serde_json::Value;

/// The parts of a pod the checks read, with containers flattened in `visitContainers` order.
pub(super) struct Pod<'a> {
    pub(super) metadata: &'a Value,
    pub(super) spec: &'a Value,
    /// `spec.securityContext`, when set.
    pub(super) security_context: Option<&'a Value>,
    pub(super) containers: Vec<Container<'a>>,
}

pub(super) struct Container<'a> {
    pub(super) name: &'a str,
    pub(super) value: &'a Value,
    /// `securityContext`, when set: upstream distinguishes a nil context from an empty one.
    pub(super) security_context: Option<&'a Value>,
}

impl<'a> Pod<'a> {
    pub(super) fn new(metadata: &'a Value, spec: &'a Value) -> Pod<'a> {
        // Ephemeral containers share the Container fields the checks read
        // (EphemeralContainerCommon), so they are visited the same way, last.
        let containers = ["initContainers", "containers", "ephemeralContainers"]
            .iter()
            .flat_map(|key| items(field(spec, key)))
            .map(|value| Container {
                name: text(field(value, "name")),
                value,
                security_context: field(value, "securityContext"),
            })
            .collect();
        Pod {
            metadata,
            spec,
            security_context: field(spec, "securityContext"),
            containers,
        }
    }

    /// `spec.os.name == windows`: some restricted checks cannot apply to Windows pods (1.25+).
    pub(super) fn is_windows(&self) -> bool {
        text(path(self.spec, &["os", "name"])) == "windows"
    }

    /// `spec.hostUsers == false`: a user-namespaced pod relaxes some checks (1.35+).
    pub(super) fn in_user_namespace(&self) -> bool {
        matches!(field(self.spec, "hostUsers"), Some(Value::Bool(false)))
    }

    /// A field of `spec.securityContext`, when set.
    pub(super) fn pod_context(&self, key: &str) -> Option<&'a Value> {
        self.security_context.and_then(|sc| field(sc, key))
    }
}

impl<'a> Container<'a> {
    /// A field of the container's `securityContext`, when set.
    pub(super) fn context(&self, key: &str) -> Option<&'a Value> {
        self.security_context.and_then(|sc| field(sc, key))
    }
}

/// `v[key]`, treating JSON null like an absent field, as a nil Go pointer.
pub(super) fn field<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    v.get(key).filter(|x| !x.is_null())
}

pub(super) fn path<'a>(v: &'a Value, keys: &[&str]) -> Option<&'a Value> {
    keys.iter().try_fold(v, |cur, key| field(cur, key))
}

pub(super) fn is_true(v: Option<&Value>) -> bool {
    matches!(v, Some(Value::Bool(true)))
}

/// A string field, with Go's zero value "" when unset.
pub(super) fn text(v: Option<&Value>) -> &str {
    v.and_then(Value::as_str).unwrap_or("")
}

pub(super) fn items(v: Option<&Value>) -> &[Value] {
    v.and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

pub(super) fn is_zero(v: Option<&Value>) -> bool {
    v.is_some_and(|v| v.as_i64() == Some(0) || v.as_f64() == Some(0.0))
}
