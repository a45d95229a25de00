//! Python bytecode for a base image, compiled when the image is built (see
//! [`super::recipe::BytecodeRecipe`]): the image's own interpreter runs `compileall` in kiln's
//! sandbox over the Debian tree, with the runtime packages bound in read-only and only the
//! output directory writable, reproducibly (`unchecked-hash` .pyc files, `PYTHONHASHSEED=0`,
//! no `site`, no import-time writes).

use std::path::{Path, PathBuf};

use super::debian::LockedPackage;
use super::recipe::{BytecodeRecipe, Lock, Target};
use crate::oci::Platform;
use crate::sandbox::Bind;
use crate::sandbox::emulator::Emulator;

/// For a foreign `arch`, this machine's base packages when their Python is the very same
/// (every package named `*python*` at the same version in both architectures' locks): its
/// interpreter compiles the foreign tree's bytecode natively, since a .pyc file does not
/// depend on the CPU (kiln checked that an emulated python3.13 compiles the same layer, and
/// a test keeps checking it for a module). `None` on this machine's architecture, or when the
/// versions differ and the image's own interpreter must run, under emulation.
pub(super) fn native_python(all: &Lock, lock: &Lock, arch: &str) -> Option<Vec<LockedPackage>> {
    let host = Platform::host();
    if host.architecture == arch {
        return None;
    }
    let native = all.for_arch(&host.architecture)?;
    let pythons = |lock: &Lock| -> Vec<(String, String)> {
        lock.debs(Target::Base)
            .filter(|p| p.name.contains("python"))
            .map(|p| (p.name.clone(), p.version.clone()))
            .collect()
    };
    let same = pythons(&native) == pythons(lock) && !pythons(lock).is_empty();
    same.then(|| native.debs(Target::Base).cloned().collect())
}

/// Which interpreter compiles.
#[derive(Clone, Debug)]
pub enum Compiler {
    /// The tree's own, built for this platform (emulated when it is not this machine's).
    Own(Platform),
    /// The same Python built for this machine, in this tree of its packages: it runs with the
    /// compiled tree's directories bound over its own (its C extension modules excepted), so
    /// it compiles the very files the image holds. A .pyc file depends on the Python version
    /// and the source, not on the CPU.
    Native(PathBuf),
}

/// Where CPython keeps its C extension modules, below a standard library directory.
const EXTENSIONS: &str = "lib-dynload";

/// Compiles [`BytecodeRecipe::dirs`] of the tree `root` (plus `packages`: a host directory and
/// where it goes) into the mirror tree `out/<prefix>`, with `compiler`.
///
/// # Errors
/// No sandbox, no emulator for a foreign interpreter, an interpreter that does not run or
/// fails for another reason than a module that does not compile; the message says which.
pub async fn compile(
    bytecode: &BytecodeRecipe,
    root: &Path,
    packages: Option<(PathBuf, String)>,
    out: &Path,
    compiler: &Compiler,
) -> Result<(), String> {
    let emulator = match compiler {
        Compiler::Own(platform) => Emulator::for_machine(platform.machine(), &platform.to_string())
            .map_err(|e| e.to_string())?,
        Compiler::Native(_) => None,
    };
    crate::sandbox::check_available()
        .await
        .map_err(|e| format!("{e} (the sandbox runs the image's interpreter)"))?;
    let prefix = out.join(bytecode.prefix.trim_start_matches('/'));
    std::fs::create_dir_all(&prefix).map_err(|e| format!("creating {}: {e}", prefix.display()))?;
    let mut sandbox = match compiler {
        Compiler::Own(_) => crate::sandbox::Sandbox::new(root),
        Compiler::Native(native) => {
            let mut sandbox = crate::sandbox::Sandbox::new(native);
            for dir in &bytecode.dirs {
                let inside = root.join(dir.trim_start_matches('/'));
                if inside.is_dir() {
                    sandbox.binds.push(Bind::read_only(inside, dir.clone()));
                    let extensions = native.join(dir.trim_start_matches('/')).join(EXTENSIONS);
                    if extensions.is_dir() {
                        let dest = format!("{}/{EXTENSIONS}", dir.trim_end_matches('/'));
                        sandbox.binds.push(Bind::read_only(extensions, dest));
                    }
                }
            }
            sandbox
        }
    };
    if let Some((dir, dest)) = packages
        && dir.is_dir()
    {
        sandbox.binds.push(Bind::read_only(dir, dest));
    }
    sandbox
        .binds
        .push(Bind::writable(prefix.clone(), bytecode.prefix.clone()));
    sandbox.env = vec![
        ("PATH".into(), "/usr/bin:/bin".into()),
        ("PYTHONHASHSEED".into(), "0".into()),
        ("PYTHONPYCACHEPREFIX".into(), bytecode.prefix.clone()),
        // Only compileall writes: an import (a .pth file's, say) would leave an mtime-based
        // .pyc of its own behind.
        ("PYTHONDONTWRITEBYTECODE".into(), "1".into()),
    ];
    // -S: no site, so no .pth file runs code before compileall. Another architecture's
    // bytecode is compiled in one process: an emulated interpreter's workers would be started
    // as foreign programs, which only the interpreter itself is run as. The native compiler
    // does the same, so that it writes the same bytes: marshal marks a string interned or not
    // as it is in the compiling process, which depends on what that process did before.
    let workers = match compiler {
        Compiler::Own(_) if emulator.is_none() => "0",
        _ => "1",
    };
    let mut argv: Vec<String> = [
        bytecode.python.as_str(),
        "-S",
        "-m",
        "compileall",
        "-q",
        "-j",
        workers,
        "--invalidation-mode",
        "unchecked-hash",
    ]
    .map(String::from)
    .to_vec();
    argv.extend(bytecode.dirs.iter().cloned());
    if let Some(emulator) = emulator {
        argv = emulator.apply(&mut sandbox, &argv);
    }
    let output = sandbox
        .command(&argv)
        .map_err(|e| e.to_string())?
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
