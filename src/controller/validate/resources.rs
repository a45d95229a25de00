//! `spec.resourceConfiguration`: exactly one of a profile and explicit resources; known
//! profile names; quantities that parse, are at least Kyma's minimums (10m CPU / 16Mi memory
//! for the Function, 200m / 200Mi for the build) and requests ≤ limits.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;

use super::Verdict;
use crate::controller::crd::ResourceConfiguration;
use crate::controller::presets::{BUILD_PRESETS, FUNCTION_PRESETS, Preset};
use crate::controller::quantity::Quantity;

/// One of the two resource settings and its rules.
struct Kind {
    field: &'static str,
    what: &'static str,
    table: &'static [Preset],
    min_cpu: &'static str,
    min_memory: &'static str,
}

const FUNCTION: Kind = Kind {
    field: "spec.resourceConfiguration.function",
    what: "a Function",
    table: &FUNCTION_PRESETS,
    min_cpu: "10m",
    min_memory: "16Mi",
};

const BUILD: Kind = Kind {
    field: "spec.resourceConfiguration.build",
    what: "a build",
    table: &BUILD_PRESETS,
    min_cpu: "200m",
    min_memory: "200Mi",
};

pub(super) fn check(config: Option<&ResourceConfiguration>, verdict: &mut Verdict) {
    let Some(config) = config else { return };
    if let Some(f) = &config.function {
        check_one(
            &FUNCTION,
            f.profile.as_deref(),
            f.resources.as_ref(),
            verdict,
        );
    }
    if let Some(b) = &config.build {
        check_one(&BUILD, b.profile.as_deref(), b.resources.as_ref(), verdict);
    }
}

fn profile_names(table: &[Preset]) -> String {
    table.iter().map(|p| p.name).collect::<Vec<_>>().join(", ")
}

fn check_one(
    kind: &Kind,
    profile: Option<&str>,
    resources: Option<&ResourceRequirements>,
    verdict: &mut Verdict,
) {
    let names = profile_names(kind.table);
    match (profile, resources) {
        (Some(_), Some(_)) => verdict.error(
            kind.field,
            "sets both profile and resources; keep one of them",
        ),
        (None, None) => verdict.error(
            kind.field,
            format!("needs a profile ({names}) or resources; remove it to use the default profile"),
        ),
        (Some(p), None) if !kind.table.iter().any(|preset| preset.name == p) => verdict.error(
            format!("{}.profile", kind.field),
            format!(
                "{p:?} is not a profile for {}; use one of {names}",
                kind.what
            ),
        ),
        (_, Some(r)) => check_requirements(kind, r, verdict),
        _ => {}
    }
}

fn check_requirements(kind: &Kind, r: &ResourceRequirements, verdict: &mut Verdict) {
    let field = format!("{}.resources", kind.field);
    if r.claims.as_ref().is_some_and(|c| !c.is_empty()) {
        verdict.error(
            format!("{field}.claims"),
            "resource claims are not supported; remove them",
        );
    }
    let empty = BTreeMap::new();
    let requests = parsed(
        &field,
        "requests",
        r.requests.as_ref().unwrap_or(&empty),
        verdict,
    );
    let limits = parsed(
        &field,
        "limits",
        r.limits.as_ref().unwrap_or(&empty),
        verdict,
    );
    for (section, values) in [("requests", &requests), ("limits", &limits)] {
        for (resource, minimum) in [("cpu", kind.min_cpu), ("memory", kind.min_memory)] {
            let Some(value) = values.get(resource) else {
                continue;
            };
            let Ok(min) = Quantity::parse(minimum) else {
                continue;
            };
            if *value < min {
                verdict.error(
                    format!("{field}.{section}.{resource}"),
                    format!(
                        "{value} is below the minimum {resource} for {} ({minimum}); raise it, \
                         or use a profile ({})",
                        kind.what,
                        profile_names(kind.table)
                    ),
                );
            }
        }
    }
    for (resource, request) in &requests {
        if let Some(limit) = limits.get(resource)
            && request > limit
        {
            verdict.error(
                format!("{field}.requests.{resource}"),
                format!(
                    "{request} exceeds limits.{resource} ({limit}); a request must not exceed \
                     its limit: lower the request or raise the limit"
                ),
            );
        }
    }
}

/// The quantities of one section that parse; the others are reported.
fn parsed(
    field: &str,
    section: &str,
    values: &BTreeMap<String, K8sQuantity>,
    verdict: &mut Verdict,
) -> BTreeMap<String, Quantity> {
    let mut out = BTreeMap::new();
    for (resource, value) in values {
        match Quantity::parse(&value.0) {
            Ok(q) => {
                out.insert(resource.clone(), q);
            }
            Err(e) => verdict.error(format!("{field}.{section}.{resource}"), e.to_string()),
        }
    }
    out
}
