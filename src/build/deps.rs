//! Runs the runtime's dependency install in a staging directory with a controlled
//! environment, and identifies the toolchain for the dependency cache key. The staging
//! directory holds the manifest, lock file and registry config; only the install's output
//! (`node_modules`, `site-packages`) is ever layered, so `.npmrc`/`pip.conf` cannot leak.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::process::Command;

use super::egress::{self, Policy};
use super::function::DepInputs;
use super::install_output::{read_output, tail};
use super::mask::Secrets;
use crate::io_error::IoContext as _;
use crate::oci::{Digest, Hasher};
use crate::runtime::RuntimeSpec;
use crate::sandbox::gate::Gate;

/// The environment the install runs in: nothing of the caller's environment passes except
/// what is named here.
#[derive(Clone, Debug, Default)]
pub struct InstallEnv {
    /// `PATH` to find the toolchain on.
    pub path: OsString,
    /// Extra CA bundle the install trusts (corporate TLS proxies), if any.
    pub ca_bundle: Option<PathBuf>,
    /// Proxy variables (`https_proxy`, `no_proxy`, …) passed through.
    pub proxy: Vec<(String, String)>,
    /// Shared package-download cache directory (npm/pip cache), for installs with the
    /// toolchain on `PATH` (whose scripts run unsandboxed anyway); a sandboxed install gets a
    /// private one.
    pub package_cache: PathBuf,
    /// Where the install runs.
    pub isolation: Isolation,
    /// `--no-emulation`: never run the package manager for another platform under
    /// emulation; such an install is refused.
    pub no_emulation: bool,
}

/// Where the dependency install runs.
#[derive(Clone, Debug, Default)]
pub enum Isolation {
    /// With the toolchain on `PATH`: inside the runtime's builder image (a build Job), or
    /// when asked for with `--deps-sandbox none`.
    #[default]
    Host,
    /// The toolchain on `PATH` inside the runtime's builder image named by this digest (a
    /// build Job given `--builder-image REF@DIGEST`): the digest names the toolchain in the
    /// cache key, as for an install in the same image in a sandbox, so the keys of build
    /// Jobs, `kiln warm` and local builds with that builder agree.
    Native {
        /// The builder image's manifest digest.
        builder: crate::oci::Digest,
    },
    /// Inside this builder image, unpacked (once) only when there is something to install.
    Pending(crate::run::ImageRef),
    /// A sandbox was asked for but no builder image is known: the base is not the runtime's
    /// own, so nothing says which toolchain matches it. A usage error, but only once there is
    /// something to install (a Function without dependencies needs no builder).
    MissingBuilder {
        /// The `--deps-sandbox` mode that asked for the sandbox (`auto` or `bwrap`).
        sandbox: &'static str,
    },
    /// Inside the runtime's builder image root filesystem, in a rootless sandbox (bubblewrap,
    /// or kiln's built-in one), so the toolchain (and any native module it builds) matches
    /// the base image exactly.
    Builder {
        /// The unpacked builder image.
        rootfs: PathBuf,
        /// Its manifest digest: the toolchain identity in the cache key.
        digest: crate::oci::Digest,
        /// Its config's `Env` (PATH and so on).
        env: Vec<(String, String)>,
        /// Keeps `kiln cache prune` from removing the rootfs during the install.
        in_use: crate::inuse::InUse,
        /// Runs the install's programs, when the builder image is for another CPU.
        emulator: Option<crate::sandbox::emulator::Emulator>,
    },
}

/// Where the sandboxed install sees its files.
const SANDBOX_WORK: &str = "/tmp/work";
const SANDBOX_CACHE: &str = "/tmp/cache";
const SANDBOX_CA: &str = "/tmp/kiln-ca.crt";
/// The variables that point the tools at a CA bundle: each reads a different one.
const CA_VARS: [&str; 4] = [
    "NODE_EXTRA_CA_CERTS",
    "SSL_CERT_FILE",
    "PIP_CERT",
    "REQUESTS_CA_BUNDLE",
];

/// Why the install failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The tool is not on PATH.
    #[error(
        "{tool} is not on PATH; the {runtime} runtime installs dependencies with it (install it, \
            or build inside the runtime's builder image)"
    )]
    ToolMissing {
        /// The program.
        tool: String,
        /// The runtime.
        runtime: String,
    },
    /// The host toolchain is not the runtime's.
    #[error(
        "{tool} on PATH is {found:?} but the {runtime} runtime needs {expected}*: install \
            dependencies in a builder image instead (--deps-sandbox auto with --builder-image REF, \
            or drop --base to use the runtime's own) or put a matching {tool} on PATH"
    )]
    ToolchainMismatch {
        /// The program.
        tool: String,
        /// The runtime.
        runtime: String,
        /// The expected version prefix.
        expected: String,
        /// What the tool printed.
        found: String,
    },
    /// The install exited non-zero.
    #[error("`{command}` failed ({status}); last lines of its output:\n{stderr_tail}")]
    Failed {
        /// The command line.
        command: String,
        /// Exit status.
        status: String,
        /// Redacted tail of stderr.
        stderr_tail: String,
    },
    /// The install's private network could not be set up.
    #[error(
        "setting up the network of the install sandbox: {source}{}",
        tail_note(stderr_tail)
    )]
    Network {
        /// What failed.
        source: std::io::Error,
        /// Redacted tail of the sandbox's stderr.
        stderr_tail: String,
    },
    /// The install succeeded but produced nothing where expected (or a link, not a directory).
    #[error("`{command}` succeeded but produced no {output} directory")]
    NoOutput {
        /// The command line.
        command: String,
        /// The expected output.
        output: String,
    },
    /// A registry credential of the install's configuration is in a file it left.
    #[error(
        "the install wrote a registry credential from .npmrc/pip.conf into {output}/{file}: \
         refused, nothing of it is layered, cached or pushed. An install script of a \
         dependency copied it; find which one, and rotate the credential"
    )]
    SecretInOutput {
        /// The output directory's name.
        output: String,
        /// The file, relative to it.
        file: String,
    },
    /// Staging or process I/O.
    #[error(transparent)]
    Io(#[from] crate::io_error::IoError),
}

impl InstallEnv {
    fn apply(&self, cmd: &mut Command, runtime: &RuntimeSpec, home: &Path) {
        cmd.env_clear()
            .env("PATH", &self.path)
            .env("HOME", home)
            .env("LANG", "C.UTF-8");
        if let Some(ca) = &self.ca_bundle {
            // Each tool reads a different variable; the bundle is mounted for the install
            // only and never layered.
            for var in CA_VARS {
                cmd.env(var, ca);
            }
        }
        for (k, v) in &self.proxy {
            cmd.env(k, v);
        }
        if let Some(var) = &runtime.dependencies.cache_env {
            cmd.env(var, self.package_cache.join(&runtime.name));
        }
    }
}

/// The toolchain identity of a builder image: its manifest digest.
pub fn builder_toolchain_id(digest: &crate::oci::Digest) -> String {
    format!("builder image {digest}")
}

/// An identity of the toolchain on PATH (`node --version` and so on), for the cache key.
///
/// # Errors
/// When a toolchain command is missing or fails, or the toolchain on PATH is not the
/// runtime's (`toolchain_version`).
pub async fn toolchain_id(
    runtime: &RuntimeSpec,
    env: &InstallEnv,
    scratch: &Path,
) -> Result<String, Error> {
    let id = path_toolchain(runtime, env, scratch).await?;
    check_toolchain(runtime, &id)?;
    Ok(id)
}

/// What the toolchain commands on PATH print.
async fn path_toolchain(
    runtime: &RuntimeSpec,
    env: &InstallEnv,
    scratch: &Path,
) -> Result<String, Error> {
    let mut id = String::new();
    for argv in &runtime.dependencies.toolchain {
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .current_dir(scratch)
            .stdin(Stdio::null());
        env.apply(&mut cmd, runtime, scratch);
        let out = cmd
            .output()
            .await
            .map_err(|e| spawn_error(e, &argv[0], runtime, scratch))?;
        if !out.status.success() {
            return Err(Error::Failed {
                command: argv.join(" "),
                status: out.status.to_string(),
                stderr_tail: tail(&String::from_utf8_lossy(&out.stderr), &Secrets::default()),
            });
        }
        id.push_str(String::from_utf8_lossy(&out.stdout).trim());
        id.push('\n');
    }
    Ok(id)
}

/// Compares the toolchain on PATH with the runtime's: a mismatch is an error, never a
/// fallback, since native modules built by another interpreter may not load in the image.
fn check_toolchain(runtime: &RuntimeSpec, id: &str) -> Result<(), Error> {
    let (Some(expected), Some(tool)) = (
        &runtime.dependencies.toolchain_version,
        runtime.dependencies.toolchain.first(),
    ) else {
        return Ok(());
    };
    let found = id.lines().next().unwrap_or("").to_string();
    if found.starts_with(expected.as_str()) {
        return Ok(());
    }
    Err(Error::ToolchainMismatch {
        tool: tool[0].clone(),
        runtime: runtime.name.clone(),
        expected: expected.clone(),
        found,
    })
}

/// The dependency cache key: what decides the dependency layer's content.
/// The layer's timestamp (`epoch`) is part of the key because it is part of the bytes.
pub fn cache_key(
    runtime: &RuntimeSpec,
    toolchain: &str,
    inputs: &DepInputs,
    epoch: u64,
    compression: crate::oci::Compression,
) -> Digest {
    let mut h = Hasher::new();
    let mut field = |label: &str, bytes: &[u8]| {
        h.update(label.as_bytes());
        h.update(&(bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    field("kiln-deps-v1", b"");
    field("runtime", runtime.name.as_bytes());
    field(
        "install",
        runtime
            .install_command(inputs.lock.is_some())
            .join("\0")
            .as_bytes(),
    );
    field("toolchain", toolchain.as_bytes());
    field("epoch", &epoch.to_le_bytes());
    // Gzip keys stay what they were before zstd existed.
    if compression == crate::oci::Compression::Zstd {
        field("compression", b"zstd");
    }
    field(&inputs.manifest.name, &inputs.manifest.bytes);
    if let Some(lock) = &inputs.lock {
        field(&lock.name, &lock.bytes);
    }
    for config in &inputs.configs {
        // The registry config decides what gets installed; hash it, never store it.
        field(&config.name, Digest::of(&config.bytes).hex().as_bytes());
    }
    h.finish().0
}

/// Runs the install in `staging` and returns the directory to layer.
///
/// # Errors
/// Missing tool, failing install, missing output.
pub async fn install(
    runtime: &RuntimeSpec,
    inputs: &DepInputs,
    env: &InstallEnv,
    staging: &Path,
) -> Result<PathBuf, Error> {
    let (work, home) = stage_inputs(inputs, staging).await?;
    if let Isolation::Native { .. } = &env.isolation {
        // The key names the builder image's digest, not what is on PATH: the toolchain that
        // is about to run is checked here, where it runs (an install with another `node`
        // or `python` first on PATH must not store its layer under the builder's name).
        check_toolchain(runtime, &path_toolchain(runtime, env, &work).await?)?;
    }
    let argv = runtime.install_command(inputs.lock.is_some());
    let command = argv.join(" ");
    let secrets = Secrets::from_configs(&inputs.configs);
    let config = inputs.configs.first().map(|c| c.name.as_str());
    let (mut cmd, gate, place) = match &env.isolation {
        // The caller resolves a pending or missing builder first (`build::run` does), and
        // `toolchain_id` refuses a toolchain on PATH that is not the runtime's.
        Isolation::Host
        | Isolation::Native { .. }
        | Isolation::Pending(_)
        | Isolation::MissingBuilder { .. } => (
            host_command(runtime, env, argv, &work, &home, config),
            None,
            "the toolchain on PATH",
        ),
        Isolation::Builder {
            rootfs,
            env: image_env,
            emulator,
            ..
        } => {
            let image = Image {
                rootfs,
                env: image_env,
                emulator: emulator.as_ref(),
            };
            let (cmd, gate) = sandbox_command(runtime, env, argv, &image, &work, config)
                .map_err(|e| spawn_error(e, &argv[0], runtime, &work))?;
            (cmd, gate, "the builder image in a sandbox")
        }
    };
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    tracing::info!(command, using = place, "installing dependencies");
    let mut child = cmd
        .spawn()
        .map_err(|e| spawn_error(e, &argv[0], runtime, &work))?;
    // The install's only way out: a proxy to the package registries, on its own loopback.
    let (_proxy, network_error) = match gate {
        Some(gate) => open_egress(gate, runtime, inputs, env, &mut child).await,
        None => (None, None),
    };
    let stderr = read_output(child.stdout.take(), child.stderr.take(), &secrets)
        .await
        .at("reading the output of", &work)?;
    let status = child.wait().await.at("waiting for the install in", &work)?;
    if let Some(source) = network_error {
        return Err(Error::Network {
            source,
            stderr_tail: tail(&stderr, &secrets),
        });
    }
    if !status.success() {
        return Err(Error::Failed {
            command,
            status: status.to_string(),
            stderr_tail: tail(&stderr, &secrets),
        });
    }
    let output = work.join(&runtime.dependencies.output);
    // Not followed: an install script may have left a link to anywhere on the host there
    // (`ln -s ~/.ssh node_modules`), which the layer would then hold.
    if !std::fs::symlink_metadata(&output).is_ok_and(|m| m.is_dir()) {
        return Err(Error::NoOutput {
            command,
            output: runtime.dependencies.output.clone(),
        });
    }
    // The registry credentials of .npmrc/pip.conf were in reach of every install script:
    // one that copied them into the output must not have them layered, cached or pushed.
    if let Some(file) = secrets.first_file_holding(&output).at("reading", &output)? {
        return Err(Error::SecretInOutput {
            output: runtime.dependencies.output.clone(),
            file: file.display().to_string(),
        });
    }
    if let Some(report) = &runtime.dependencies.report {
        // The report is the install's, so as untrusted as the tree: a broken one costs the
        // SBOM its hashes, not the build.
        match super::pinned::provenance::from_pip_report(&output, &work.join(report)) {
            Ok(n) => tracing::debug!(distributions = n, "recorded where each came from"),
            Err(e) => tracing::warn!(
                error = %e,
                "the SBOM will not have the archives' hashes: reading the install's report"
            ),
        }
    }
    Ok(output)
}

/// The install's working directory (with the dependency manifest, lock file and registry
/// configs written into it) and its home, under `staging`.
async fn stage_inputs(inputs: &DepInputs, staging: &Path) -> Result<(PathBuf, PathBuf), Error> {
    let work = staging.join("work");
    let home = staging.join("home");
    for dir in [&work, &home] {
        tokio::fs::create_dir_all(dir).await.at("creating", dir)?;
    }
    let files = std::iter::once(&inputs.manifest)
        .chain(&inputs.lock)
        .chain(&inputs.configs);
    for file in files {
        let path = work.join(&file.name);
        tokio::fs::write(&path, &file.bytes)
            .await
            .map_err(|source| {
                Error::Io(crate::io_error::IoError {
                    action: "writing",
                    path,
                    source,
                })
            })?;
    }
    Ok((work, home))
}

/// Opens the sandbox's network gate onto an egress proxy that admits only the package
/// registries; a gate that cannot open stops the install, whose stderr then explains it.
async fn open_egress(
    gate: Gate,
    runtime: &RuntimeSpec,
    inputs: &DepInputs,
    env: &InstallEnv,
    child: &mut tokio::process::Child,
) -> (Option<AbortOnDrop>, Option<std::io::Error>) {
    let policy = Policy::for_install(
        &runtime.dependencies.registries,
        &inputs.configs,
        &env.proxy,
    );
    tracing::debug!(hosts = ?policy.hosts().collect::<Vec<_>>(), "the install may reach");
    match gate.open(child).await {
        Ok(listener) => (
            Some(AbortOnDrop(tokio::spawn(egress::serve(
                listener,
                std::sync::Arc::new(policy),
            )))),
            None,
        ),
        // The gate killed the sandbox before its program ran: report with its stderr.
        Err(e) => (None, Some(e)),
    }
}

fn host_command(
    runtime: &RuntimeSpec,
    env: &InstallEnv,
    argv: &[String],
    work: &Path,
    home: &Path,
    config: Option<&str>,
) -> Command {
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]).current_dir(work);
    env.apply(&mut cmd, runtime, home);
    if let (Some(var), Some(config)) = (&runtime.dependencies.config_env, config) {
        cmd.env(var, work.join(config));
    }
    cmd
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<std::io::Result<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The port of the install's proxy on the sandbox's own loopback.
const PROXY_PORT: u16 = 3128;

/// The install inside the builder image: its root read-only, the staging directory at
/// `/tmp/work`, a private package cache at `/tmp/cache`, the CA bundle at `/tmp/kiln-ca.crt` (for
/// the install only: none of these paths is ever layered), only the image's env plus what
/// the install needs, and a private network whose only way out is kiln's proxy to the
/// package registries ([`egress`]).
fn sandbox_command(
    runtime: &RuntimeSpec,
    env: &InstallEnv,
    argv: &[String],
    image: &Image<'_>,
    work: &Path,
    config: Option<&str>,
) -> std::io::Result<(Command, Option<Gate>)> {
    use crate::sandbox::{Bind, Sandbox};
    // A private package cache: a shared writable one let one Function's install script plant
    // packages that the next Function's install took. It goes with the staging directory.
    let cache = work.with_file_name("package-cache");
    let mut sandbox = Sandbox::new(image.rootfs);
    sandbox.cwd = SANDBOX_WORK.into();
    sandbox.binds.push(Bind::writable(work, SANDBOX_WORK));
    sandbox.binds.push(Bind::writable(&cache, SANDBOX_CACHE));
    sandbox
        .binds
        .push(Bind::read_only("/etc/resolv.conf", "/etc/resolv.conf").optional());
    let mut vars: Vec<(String, String)> = image.env.to_vec();
    vars.extend([
        ("HOME".into(), "/tmp".into()),
        ("LANG".into(), "C.UTF-8".into()),
    ]);
    if let Some(ca) = &env.ca_bundle {
        sandbox.binds.push(Bind::read_only(ca, SANDBOX_CA));
        for var in CA_VARS {
            vars.push((var.into(), SANDBOX_CA.into()));
        }
    }
    // Every tool honours these; the proxy itself goes on through any upstream proxy.
    let proxy = format!("http://127.0.0.1:{PROXY_PORT}");
    for var in ["http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"] {
        vars.push((var.into(), proxy.clone()));
    }
    if let Some(var) = &runtime.dependencies.cache_env {
        vars.push((var.clone(), SANDBOX_CACHE.into()));
    }
    if let (Some(var), Some(config)) = (&runtime.dependencies.config_env, config) {
        vars.push((var.clone(), format!("{SANDBOX_WORK}/{config}")));
    }
    sandbox.env = vars;
    std::fs::create_dir_all(&cache)?;
    let argv = match image.emulator {
        Some(emulator) => emulator.apply(&mut sandbox, argv),
        None => argv.to_vec(),
    };
    let (cmd, gate) = crate::sandbox::gate::command(&sandbox, &argv, PROXY_PORT)?;
    Ok((cmd, Some(gate)))
}

/// The builder image a sandboxed install runs in.
struct Image<'a> {
    /// Its unpacked root filesystem.
    rootfs: &'a Path,
    /// Its config's `Env`.
    env: &'a [(String, String)],
    /// Its CPU's emulator, when that is not this machine's.
    emulator: Option<&'a crate::sandbox::emulator::Emulator>,
}

fn spawn_error(e: std::io::Error, tool: &str, runtime: &RuntimeSpec, dir: &Path) -> Error {
    if e.kind() == std::io::ErrorKind::NotFound {
        Error::ToolMissing {
            tool: tool.into(),
            runtime: runtime.name.clone(),
        }
    } else {
        Error::Io(crate::io_error::IoError {
            action: "starting the install in",
            path: dir.to_path_buf(),
            source: e,
        })
    }
}

/// ": <tail>" when the tail says anything.
fn tail_note(tail: &str) -> String {
    if tail.trim().is_empty() {
        String::new()
    } else {
        format!("; the sandbox said: {}", tail.trim())
    }
}

#[cfg(test)]
#[path = "deps_tests.rs"]
mod tests;
