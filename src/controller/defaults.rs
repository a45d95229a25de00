//! The mutating webhook's defaulting, as RFC 6902 JSON patch operations on the Function the
//! API server sent. Pure. It works on the raw JSON, not the typed [`Function`], because what
//! is *absent* matters and the typed form fills defaults in.
//!
//! Kyma's semantics (its v1alpha2 webhook and controller), with the spec kept minimal:
//! - `spec.replicas` absent → `scaleConfig.minReplicas` when set, else 1; present but outside
//!   `[minReplicas, maxReplicas]` → clamped into it (the HPA would do the same, and with
//!   min = max there is no HPA). The CRD itself defaults `replicas: 1`, and the API server
//!   applies CRD defaults before calling webhooks, so in a cluster with kiln's CRD the
//!   clamping is what makes `scaleConfig.minReplicas` win.
//! - A Node.js inline Function whose `dependencies` is present but blank gets `"{}"` (a blank
//!   string is not a package.json; Kyma's controller made the same substitution). An absent
//!   `dependencies` stays absent: the build treats it as `{}` and the spec stays minimal.
//!   Python's blank requirements.txt is valid as it is.
//! - Explicit `resources` (Function or build): a resource with a limit and no request gets the
//!   limit as its request (Kubernetes' own container defaulting); cpu or memory with a request
//!   and no limit gets the larger of the request and the default profile's limit (Kyma clamped
//!   so that request ≤ limit). Other resources requested without a limit keep no limit: no
//!   profile says what it would be.
//! - No profile and no resources → nothing: the controller applies its default profile and
//!   records it in `status.*ResourceProfile`. A profile is never written into the spec, and
//!   `runtime` is never defaulted (the CRD requires it; Kyma's module-era webhook stopped
//!   defaulting it too).
//!
//! [`Function`]: super::crd::Function

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation, ReplaceOperation};
use serde_json::{Map, Value};

use super::presets::{self, BUILD_PRESETS, FUNCTION_PRESETS, Preset};
use super::quantity::Quantity;
use crate::runtime::{Catalog, Language};

/// The profiles whose limits complete explicit requests (the controller's defaults).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DefaultProfiles {
    /// For `resourceConfiguration.function`.
    pub function: Preset,
    /// For `resourceConfiguration.build`.
    pub build: Preset,
}

impl Default for DefaultProfiles {
    fn default() -> DefaultProfiles {
        let pick = |table: &[Preset], name| presets::find(table, name).unwrap_or(table[0]);
        DefaultProfiles {
            function: pick(&FUNCTION_PRESETS, presets::DEFAULT_FUNCTION_PROFILE),
            build: pick(&BUILD_PRESETS, presets::DEFAULT_BUILD_PROFILE),
        }
    }
}

/// The patch that defaults `function` (a Function object as JSON); empty when nothing is
/// missing or the object is too malformed to default (validation reports it).
pub fn defaults(function: &Value, catalog: &Catalog, profiles: &DefaultProfiles) -> Patch {
    let mut ops = Vec::new();
    if let Some(spec) = function.get("spec").and_then(Value::as_object) {
        replicas(spec, &mut ops);
        dependencies(spec, catalog, &mut ops);
        resources(spec, "function", &profiles.function, &mut ops);
        resources(spec, "build", &profiles.build, &mut ops);
    }
    Patch(ops)
}

fn pointer(tokens: &[&str]) -> PointerBuf {
    PointerBuf::from_tokens(tokens.iter().copied())
}

fn add(ops: &mut Vec<PatchOperation>, tokens: &[&str], value: Value) {
    ops.push(PatchOperation::Add(AddOperation {
        path: pointer(tokens),
        value,
    }));
}

fn replicas(spec: &Map<String, Value>, ops: &mut Vec<PatchOperation>) {
    let bounds = spec.get("scaleConfig").and_then(|s| {
        let min = s.get("minReplicas")?.as_i64()?;
        let max = s.get("maxReplicas")?.as_i64()?;
        (1 <= min && min <= max).then_some((min, max))
    });
    match (spec.get("replicas"), bounds) {
        (None | Some(Value::Null), _) => {
            let value = bounds.map_or(1, |(min, _)| min);
            add(ops, &["spec", "replicas"], value.into());
        }
        (Some(current), Some((min, max))) => {
            if let Some(n) = current.as_i64().filter(|n| *n < min || *n > max) {
                ops.push(PatchOperation::Replace(ReplaceOperation {
                    path: pointer(&["spec", "replicas"]),
                    value: n.clamp(min, max).into(),
                }));
            }
        }
        (Some(_), None) => {}
    }
}

fn dependencies(spec: &Map<String, Value>, catalog: &Catalog, ops: &mut Vec<PatchOperation>) {
    let Some(runtime) = spec.get("runtime").and_then(Value::as_str) else {
        return;
    };
    let Ok((runtime, _)) = catalog.resolve(runtime) else {
        return;
    };
    let blank = spec
        .get("source")
        .and_then(|s| s.get("inline"))
        .and_then(|i| i.get("dependencies"))
        .and_then(Value::as_str)
        .is_some_and(|d| d.trim().is_empty());
    if runtime.language == Language::Nodejs && blank {
        ops.push(PatchOperation::Replace(ReplaceOperation {
            path: pointer(&["spec", "source", "inline", "dependencies"]),
            value: "{}".into(),
        }));
    }
}

fn resources(
    spec: &Map<String, Value>,
    kind: &str,
    profile: &Preset,
    ops: &mut Vec<PatchOperation>,
) {
    let Some(settings) = spec
        .get("resourceConfiguration")
        .and_then(|r| r.get(kind))
        .and_then(Value::as_object)
    else {
        return;
    };
    // Both a profile and resources is an error for validation to report, not to default.
    if settings.contains_key("profile") {
        return;
    }
    let Some(resources) = settings.get("resources").and_then(Value::as_object) else {
        return;
    };
    let section = |name: &str| match resources.get(name) {
        None | Some(Value::Null) => Some(Map::new()),
        Some(Value::Object(m)) => Some(m.clone()),
        Some(_) => None,
    };
    let (Some(requests), Some(limits)) = (section("requests"), section("limits")) else {
        return;
    };
    let mut new_requests = Map::new();
    for (name, limit) in &limits {
        if !requests.contains_key(name) {
            new_requests.insert(name.clone(), limit.clone());
        }
    }
    let mut new_limits = Map::new();
    for (name, request) in &requests {
        let profile_limit = match name.as_str() {
            "cpu" => profile.limits.0,
            "memory" => profile.limits.1,
            _ => continue,
        };
        if limits.contains_key(name) {
            continue;
        }
        let (Some(text), Ok(default)) = (request.as_str(), Quantity::parse(profile_limit)) else {
            continue;
        };
        let Ok(request) = Quantity::parse(text) else {
            continue;
        };
        let limit = if request > default {
            text
        } else {
            profile_limit
        };
        new_limits.insert(name.clone(), limit.into());
    }
    let base = ["spec", "resourceConfiguration", kind, "resources"];
    for (section, present, new) in [
        ("requests", &requests, new_requests),
        ("limits", &limits, new_limits),
    ] {
        if new.is_empty() {
            continue;
        }
        if present.is_empty() {
            add(ops, &[&base[..], &[section]].concat(), Value::Object(new));
        } else {
            for (name, value) in new {
                add(ops, &[&base[..], &[section, name.as_str()]].concat(), value);
            }
        }
    }
}

#[cfg(test)]
mod tests;
