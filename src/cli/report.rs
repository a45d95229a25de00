//! What `kiln build` writes besides stdout: `--digest-file` and the `--report` JSON.

use std::path::PathBuf;

use anyhow::Context;

use crate::build::{self, Stage};

/// What `kiln build` does after the build, and the local store when the base comes from it.
pub(super) struct Extra {
    /// `--digest-file`.
    pub digest_file: Option<PathBuf>,
    /// `--report`.
    pub report: Option<PathBuf>,
    /// `--verify`.
    pub verify: bool,
    /// The local store, when the base comes from it.
    pub store: Option<PathBuf>,
    /// `--platform`: the image's platform, or each platform's when there are several.
    pub platforms: Vec<crate::oci::Platform>,
}

/// Writes `--digest-file` and `--report` for a finished image.
pub(super) fn write_outputs(
    extra: &Extra,
    stage: &Stage,
    output: &build::Output,
    traffic: crate::registry::Traffic,
) -> anyhow::Result<()> {
    if let Some(path) = &extra.digest_file {
        std::fs::write(path, format!("{}\n", output.published.digest))
            .with_context(|| format!("writing the digest to {}", path.display()))?;
    }
    if let Some(path) = &extra.report {
        let report = serde_json::json!({
            "stage": if matches!(stage, Stage::Publish(_)) { "publish" } else { "all" },
            "reference": output.published.reference,
            "digest": output.published.digest,
            "buildKey": output.image_key,
            "unchanged": output.unchanged,
            "commit": output.commit,
            "blobs": output.published.blobs,
            "registry": traffic,
        });
        let bytes = serde_json::to_vec_pretty(&report).context("serialising the report")?;
        std::fs::write(path, bytes)
            .with_context(|| format!("writing the report to {}", path.display()))?;
    }
    Ok(())
}

/// `--report` for `--stage deps`: the record written to the stage directory, and the commit.
pub(super) fn write_deps_report(extra: &Extra, output: &build::DepsOutput) -> anyhow::Result<()> {
    if let Some(path) = &extra.report {
        let report = serde_json::json!({
            "stage": "deps",
            "commit": output.commit,
            "record": output.record,
        });
        let bytes = serde_json::to_vec_pretty(&report).context("serialising the report")?;
        std::fs::write(path, bytes)
            .with_context(|| format!("writing the report to {}", path.display()))?;
    }
    Ok(())
}
