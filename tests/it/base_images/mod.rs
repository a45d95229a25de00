//! Base and builder images assembled by kiln from signed Debian packages and the npm
//! registry, proven by running them: for every runtime, a Function built on the base runs in
//! `kiln run` (rootless sandbox, read-only root, user 1000) and answers over HTTP as the
//! runtime contract says. Also: a base build is reproducible (into a layout or a registry),
//! and a bad signature or a corrupted package fails the build with a clear error.
//!
//! One module per area; the base builds and fixture paths they share are here, `kiln run` and
//! the raw HTTP calls in `common::function_run` and `common::http`.

mod assembly;
mod builder;
mod contract;
mod init;
mod kyma_packages;
mod local_store;
mod platforms;

use crate::common;

use std::path::{Path, PathBuf};

use common::kiln::{Kiln, fixtures};

/// `runtime`'s base and builder images in the layout `out` (assembled once per kiln binary
/// for all tests); what `kiln base build` printed.
fn base_build(k: &Kiln, runtime: &str, out: &Path) -> Vec<String> {
    common::kiln::base_images_into(k, runtime, out)
}

/// `kiln base build RUNTIME --output oci:OUT EXTRA…` run here and now (a test of the command).
fn base_build_with(k: &Kiln, runtime: &str, out: &Path, extra: &[&str]) -> Vec<String> {
    let run = k.run_cmd(
        k.command_with_shared_downloads()
            .args([
                "base",
                "build",
                runtime,
                "--output",
                &format!("oci:{}", out.display()),
            ])
            .args(extra),
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    run.stdout.lines().map(str::to_string).collect()
}

fn functions(name: &str) -> PathBuf {
    fixtures().join("functions").join(name)
}

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(name)
}
