//! OCI image-spec validation with Python `jsonschema` against the schemas copied into
//! `tests/fixtures/oci-schemas` (see `validate_oci.py`).

use std::path::Path;
use std::process::Command;

use super::{harness_dir, require_tool, try_run_with_input};

/// The document kinds `validate_oci.py` knows.
pub const KINDS: [&str; 4] = ["manifest", "index", "config", "layout"];

fn validator() -> Command {
    require_tool("python3", "python3-jsonschema");
    let mut cmd = Command::new("python3");
    cmd.arg(harness_dir().join("validate_oci.py"));
    cmd
}

/// Validates a JSON document of `kind` (`manifest`, `index`, `config` or `layout`, the last
/// being the `oci-layout` file). `Err` carries the validator's report.
pub fn check_json(kind: &str, bytes: &[u8]) -> Result<(), String> {
    assert!(
        KINDS.contains(&kind),
        "unknown OCI document kind {kind:?}; expected one of {KINDS:?}"
    );
    try_run_with_input(validator().arg(kind).arg("-"), Some(bytes))
        .map(|_| ())
        .map_err(|e| {
            format!(
                "invalid OCI {kind}:\n{}\n{e}",
                String::from_utf8_lossy(bytes)
            )
        })
}

/// Like [`check_json`], panicking with the validator's report when invalid.
pub fn validate_json(kind: &str, bytes: &[u8]) {
    if let Err(e) = check_json(kind, bytes) {
        panic!("{e}");
    }
}

/// Validates a whole OCI image layout: `oci-layout`, `index.json`, and every manifest reachable
/// from it (recursing into nested indexes) plus its config, checking that every referenced blob
/// exists with the right digest (sha256/sha512) and size.
pub fn check_layout(dir: &Path) -> Result<(), String> {
    try_run_with_input(validator().arg("tree").arg(dir), None)
        .map(|_| ())
        .map_err(|e| format!("invalid OCI image layout {}:\n{e}", dir.display()))
}

/// Like [`check_layout`], panicking with the validator's report when invalid.
pub fn validate_layout(dir: &Path) {
    if let Err(e) = check_layout(dir) {
        panic!("{e}");
    }
}

/// Validates the JSON `document` against the JSON Schema file `schema` (in the draft it
/// names), with `validate_json_schema.py`. `Err` carries every error.
pub fn check_json_schema(schema: &Path, document: &serde_json::Value) -> Result<(), String> {
    require_tool("python3", "python3-jsonschema");
    let input = serde_json::to_vec(document).expect("JSON");
    try_run_with_input(
        Command::new("python3")
            .arg(harness_dir().join("validate_json_schema.py"))
            .arg(schema),
        Some(&input),
    )
    .map(|_| ())
    .map_err(|e| format!("invalid against {}:\n{e}", schema.display()))
}
