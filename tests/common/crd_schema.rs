//! Custom resources checked against their CRD's schema, strictly (unknown fields are errors),
//! with `validate_crd.py`: the Function CRD kiln prints, Knative Serving's published one.

use std::path::Path;
use std::process::Command;

use super::{harness_dir, require_tool, try_run_with_input};

/// Validates `objects` against the CRD in `crd` (a YAML file). `Err` carries every error.
pub fn validate(crd: &Path, objects: &[serde_json::Value]) -> Result<(), String> {
    require_tool("python3", "python3");
    let input = serde_json::to_vec(objects).expect("JSON");
    try_run_with_input(
        Command::new("python3")
            .arg(harness_dir().join("validate_crd.py"))
            .arg(crd),
        Some(&input),
    )
    .map(|_| ())
    .map_err(|e| format!("invalid against {}:\n{e}", crd.display()))
}
