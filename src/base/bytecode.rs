//! Python bytecode for a base image, compiled when the image is built (see
//! [`super::recipe::BytecodeRecipe`]): the image's own interpreter runs `compileall` in kiln's
//! sandbox over the Debian tree, with the runtime packages bound in read-only and only the
//! output directory writable, reproducibly (`unchecked-hash` .pyc files, `PYTHONHASHSEED=0`,
//! no `site`, no import-time writes).

use std::path::{Path, PathBuf};

use super::recipe::BytecodeRecipe;

/// Compiles [`BytecodeRecipe::dirs`] of the tree `root` (plus `packages`: a host directory and
/// where it goes) into the mirror tree `out/<prefix>`.
///
/// # Errors
/// No sandbox, an interpreter that does not run or fails for another reason than a module
/// that does not compile; the message says which.
pub async fn compile(
    bytecode: &BytecodeRecipe,
    root: &Path,
    packages: Option<(PathBuf, String)>,
    out: &Path,
) -> Result<(), String> {
    crate::sandbox::check_available()
        .await
        .map_err(|e| format!("{e} (the sandbox runs the image's interpreter)"))?;
    let prefix = out.join(bytecode.prefix.trim_start_matches('/'));
    std::fs::create_dir_all(&prefix).map_err(|e| format!("creating {}: {e}", prefix.display()))?;
    let mut sandbox = crate::sandbox::Sandbox::new(root);
    if let Some((dir, dest)) = packages
        && dir.is_dir()
    {
        sandbox
            .binds
            .push(crate::sandbox::Bind::read_only(dir, dest));
    }
    sandbox.binds.push(crate::sandbox::Bind::writable(
        prefix.clone(),
        bytecode.prefix.clone(),
    ));
    sandbox.env = vec![
        ("PATH".into(), "/usr/bin:/bin".into()),
        ("PYTHONHASHSEED".into(), "0".into()),
        ("PYTHONPYCACHEPREFIX".into(), bytecode.prefix.clone()),
        // Only compileall writes: an import (a .pth file's, say) would leave an mtime-based
        // .pyc of its own behind.
        ("PYTHONDONTWRITEBYTECODE".into(), "1".into()),
    ];
    // -S: no site, so no .pth file runs code before compileall.
    let mut argv: Vec<String> = [
        bytecode.python.as_str(),
        "-S",
        "-m",
        "compileall",
        "-q",
        "-j",
        "0",
        "--invalidation-mode",
        "unchecked-hash",
    ]
    .map(String::from)
    .to_vec();
    argv.extend(bytecode.dirs.iter().cloned());
    let output = sandbox
        .command(&argv)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .map_err(|e| e.to_string())?;
    if !output.status.success() {
        // compileall exits 1 when some file does not compile (Python 2 leftovers in a
        // package, say): the rest is compiled, and those modules compile at run time.
        let text = String::from_utf8_lossy(&output.stdout);
        let tail: Vec<&str> = text.lines().rev().take(5).collect();
        if output.status.code() != Some(1) {
            return Err(format!("{}: {}", output.status, tail.join(" | ")));
        }
        tracing::warn!(output = %tail.join(" | "), "some modules did not compile");
    }
    Ok(())
}
