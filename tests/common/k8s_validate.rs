//! Kubernetes objects checked offline against the Kubernetes 1.33 OpenAPI schema with PyPI
//! `kubernetes-validate --strict` (unknown fields are errors).

use std::path::Path;
use std::process::Command;

use super::{require_tool, try_run_with_input};

/// Validates the YAML documents in `file`. `Err` carries the validator's report.
pub fn validate_file(file: &Path) -> Result<(), String> {
    require_tool(
        "kubernetes-validate",
        "python3 -m pip install kubernetes-validate==1.37.0",
    );
    try_run_with_input(
        Command::new("kubernetes-validate")
            .args(["--strict", "-k", "1.33.0", "--quiet"])
            .arg(file),
        None,
    )
    .map(|_| ())
}
