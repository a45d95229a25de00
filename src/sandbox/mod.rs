//! Rootless sandboxes around an unpacked root filesystem, for `kiln run` and sandboxed
//! dependency installs: the description ([`Sandbox`]), the choice of how to run it (bubblewrap
//! when installed, else kiln's own [`builtin`] one on util-linux `unshare`), a check that user
//! namespaces are usable, and signal forwarding into a running sandbox. It reads only
//! `PATH` and [`BACKEND_ENV`] and never prints.

pub mod builtin;
pub mod bwrap;
pub mod emulator;
pub mod gate;
mod signal;

use std::io;
use std::path::PathBuf;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use builtin::Builtin;
pub use bwrap::BWRAP;
pub use signal::{Delivery, Signal, forward_signal};

/// Chooses the sandbox: `bwrap`, `builtin`, or `auto` (the default: bwrap when installed).
pub const BACKEND_ENV: &str = "KILN_SANDBOX";

/// Errors setting up or signalling a sandbox.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Neither `bwrap` nor `unshare` is on `PATH`.
    #[error(
        "no sandbox program: {program} is not installed; install the Debian package \
         `bubblewrap` (apt-get install bubblewrap), or util-linux for kiln's built-in sandbox"
    )]
    Missing {
        /// The program looked for.
        program: String,
    },
    /// `bwrap` could not be started for another reason.
    #[error("starting {program}")]
    Spawn {
        /// The program.
        program: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The sandbox program runs but cannot create a user namespace.
    #[error(
        "{program} cannot create a user namespace ({stderr}); enable them: sysctl \
         user.max_user_namespaces must be above 0, kernel.unprivileged_userns_clone=1 on \
         kernels that have it, kernel.apparmor_restrict_unprivileged_userns=0 on Ubuntu 23.10+, \
         and inside a container the seccomp profile must allow unshare/clone (or run it with \
         --privileged)"
    )]
    NoUserNamespaces {
        /// The program that tried.
        program: &'static str,
        /// What it printed.
        stderr: String,
    },
    /// [`BACKEND_ENV`] names no sandbox kiln has.
    #[error("{BACKEND_ENV}={0:?} is not a sandbox kiln has; use bwrap, builtin or auto")]
    UnknownBackend(String),
    /// A mount point of the sandbox resolves nowhere inside the root filesystem.
    #[error(
        "the sandbox's mount point {dest} resolves nowhere inside its root filesystem \
         ({reason}): refused, since bwrap would follow the image's links from outside the \
         root; the image's links at that path are broken or loop"
    )]
    MountPoint {
        /// The mount point, as the sandbox sees it.
        dest: String,
        /// Why it does not resolve.
        reason: String,
    },
    /// A signal could not be delivered.
    #[error("sending {signal} to process {pid}")]
    Signal {
        /// The signal.
        signal: Signal,
        /// The process (or process group) id.
        pid: u32,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

/// `Result` with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A host path made visible inside the sandbox.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bind {
    /// The host path.
    pub source: PathBuf,
    /// Where it appears in the sandbox (absolute).
    pub dest: String,
    /// Whether the sandbox may write to it.
    pub writable: bool,
    /// Skip it silently when `source` does not exist (bwrap's `--*bind-try`).
    pub optional: bool,
}

impl Bind {
    /// A read-only bind of `source` at `dest`.
    pub fn read_only(source: impl Into<PathBuf>, dest: impl Into<String>) -> Bind {
        Bind {
            source: source.into(),
            dest: dest.into(),
            writable: false,
            optional: false,
        }
    }

    /// A writable bind of `source` at `dest`.
    pub fn writable(source: impl Into<PathBuf>, dest: impl Into<String>) -> Bind {
        Bind {
            writable: true,
            ..Bind::read_only(source, dest)
        }
    }

    /// The same bind, skipped when the source is missing.
    pub fn optional(self) -> Bind {
        Bind {
            optional: true,
            ..self
        }
    }
}

/// A sandbox description: a root filesystem directory run as `/` in fresh user, PID, IPC and
/// UTS namespaces (and a fresh network namespace unless `share_network`), with `/proc`, a
/// minimal `/dev` (null, zero, random, tty, pts, shm…), all capabilities dropped, a cleared
/// environment and `--die-with-parent`.
///
/// Mount points missing from `rootfs` (`/proc`, `/dev`, tmpfs and bind destinations) are
/// created in it, so `rootfs` must be writable by the caller even when `read_only_root` is
/// set; nothing else in it is modified. bwrap adds `PWD` to `env`. The built-in sandbox does
/// not bring up a loopback interface in a private network namespace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sandbox {
    /// The directory mounted as `/`.
    pub rootfs: PathBuf,
    /// Remount `/` read-only once everything is mounted (tmpfs and writable binds stay
    /// writable).
    pub read_only_root: bool,
    /// Host paths to make visible, mounted in order after the root.
    pub binds: Vec<Bind>,
    /// Fresh writable tmpfs mounts (e.g. `/tmp`).
    pub tmpfs: Vec<String>,
    /// The complete environment of the sandboxed process; never serialized, so it stays off
    /// command lines.
    #[serde(skip)]
    pub env: Vec<(String, String)>,
    /// The working directory inside the sandbox.
    pub cwd: String,
    /// The user id the process runs as (mapped to the caller's uid).
    pub uid: u32,
    /// The group id the process runs as (mapped to the caller's gid).
    pub gid: u32,
    /// Share the host's network namespace (ports bound inside are reachable on the host).
    pub share_network: bool,
    /// The host name inside the sandbox (its own UTS namespace in any case).
    pub hostname: Option<String>,
    /// Put the process in a new session, so it cannot inject input into the caller's terminal
    /// (`TIOCSTI`).
    pub new_session: bool,
    /// The built-in sandbox's side of [`gate`]: where its init sends the listener it binds on
    /// the private loopback.
    #[serde(default)]
    pub gate: Option<gate::Door>,
    /// Runs the sandbox's programs for another CPU under this emulator: every program the
    /// kernel starts in it, where [`emulator::Emulator::children`] allows (the caller still
    /// wraps the first program with [`emulator::Emulator::wrap`]). Not part of the init's
    /// description: it acts outside the sandbox.
    #[serde(skip)]
    pub emulator: Option<emulator::Emulator>,
}

impl Sandbox {
    /// A read-only sandbox of `rootfs` with a tmpfs `/tmp`, running as root (uid 0) in `/`,
    /// without network, with an empty environment.
    pub fn new(rootfs: impl Into<PathBuf>) -> Sandbox {
        Sandbox {
            rootfs: rootfs.into(),
            read_only_root: true,
            binds: Vec::new(),
            tmpfs: vec!["/tmp".into()],
            env: Vec::new(),
            cwd: "/".into(),
            uid: 0,
            gid: 0,
            share_network: false,
            hostname: None,
            new_session: true,
            gate: None,
            emulator: None,
        }
    }

    /// A command that runs `argv` in this sandbox. The environment is passed to bwrap itself
    /// (which hands it on) rather than as `--setenv` arguments, so values never show up in
    /// `ps`. stdio is inherited; the sandbox is killed when the returned child is dropped.
    ///
    /// bwrap gets its own process group: a terminal's Ctrl-C then reaches only the caller,
    /// which decides what the sandbox gets ([`forward_signal`]); bwrap would die of it at once
    /// and take the sandbox down with SIGKILL.
    ///
    /// The sandbox program is the one [`check_available`] chose (bwrap before it ran).
    ///
    /// # Errors
    /// [`Error::MountPoint`]: a mount point that resolves nowhere inside the root (bwrap).
    pub fn command(&self, argv: &[String]) -> Result<tokio::process::Command> {
        let line = match CHOSEN.get() {
            Some(Backend::Builtin(builtin)) => builtin.argv(self, argv),
            Some(Backend::Bwrap) | None => {
                let mut line = vec![BWRAP.into()];
                line.extend(bwrap::args(self, argv)?);
                line
            }
        };
        let mut line = self.emulated(line).into_iter();
        // Both lines start with their program.
        let mut cmd = tokio::process::Command::new(line.next().unwrap_or_default());
        cmd.args(line)
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .process_group(0)
            .kill_on_drop(true);
        Ok(cmd)
    }
}

impl Sandbox {
    /// The sandbox's whole command line `line`, run where its foreign programs are emulated
    /// when it has an [`Sandbox::emulator`].
    fn emulated(&self, line: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
        match &self.emulator {
            Some(emulator) => emulator.enter(line),
            None => line,
        }
    }
}

/// How sandboxes are run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Backend {
    /// bubblewrap.
    Bwrap,
    /// kiln's own, on util-linux `unshare`.
    Builtin(Builtin),
}

static CHOSEN: OnceLock<Backend> = OnceLock::new();

/// The backend [`check_available`] chose, if it ran.
pub fn chosen() -> Option<Backend> {
    CHOSEN.get().cloned()
}

/// Chooses how sandboxes run, once per process, and checks that it can create a user
/// namespace: bwrap (probed with `bwrap --unshare-user --ro-bind / / bwrap --version`) when
/// installed, else the built-in sandbox; [`BACKEND_ENV`] (`bwrap`, `builtin`, `auto`) forces
/// the choice.
///
/// # Errors
/// [`Error::Missing`] naming the Debian package, [`Error::NoUserNamespaces`] with the
/// program's message and how to enable them, [`Error::UnknownBackend`], [`Error::Spawn`].
pub async fn check_available() -> Result<Backend> {
    if let Some(chosen) = CHOSEN.get() {
        return Ok(chosen.clone());
    }
    let path = std::env::var("PATH").unwrap_or_default();
    let builtin = || async {
        let builtin = Builtin::find(&path)?;
        builtin.probe().await?;
        Ok::<_, Error>(Backend::Builtin(builtin))
    };
    let wanted = std::env::var(BACKEND_ENV).unwrap_or_default();
    let backend = match wanted.as_str() {
        "" | "auto" => match bwrap::probe(BWRAP).await {
            Ok(()) => Backend::Bwrap,
            Err(Error::Missing { .. }) => {
                tracing::info!("bubblewrap is not installed: using kiln's built-in sandbox");
                builtin().await?
            }
            Err(e) => return Err(e),
        },
        "bwrap" => bwrap::probe(BWRAP).await.map(|()| Backend::Bwrap)?,
        "builtin" => {
            tracing::info!("{BACKEND_ENV}=builtin: using kiln's built-in sandbox");
            builtin().await?
        }
        other => return Err(Error::UnknownBackend(other.to_string())),
    };
    tracing::debug!(?backend, "sandbox chosen");
    Ok(CHOSEN.get_or_init(|| backend).clone())
}

/// Runs a sandbox program's probe `cmd`: `Ok` when it exits 0, else its stderr as
/// [`Error::NoUserNamespaces`] of `name`.
async fn run_probe(name: &'static str, cmd: &mut tokio::process::Command) -> Result<()> {
    let program = cmd.as_std().get_program().to_string_lossy().into_owned();
    let output = cmd
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .map_err(|source| match source.kind() {
            io::ErrorKind::NotFound => Error::Missing {
                program: program.clone(),
            },
            _ => Error::Spawn { program, source },
        })?;
    if output.status.success() {
        return Ok(());
    }
    Err(Error::NoUserNamespaces {
        program: name,
        stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_goes_to_bwrap_and_not_into_its_arguments() {
        let sandbox = Sandbox {
            env: vec![("TOKEN".into(), "s3cret".into())],
            ..Sandbox::new("/r")
        };
        let cmd = sandbox.command(&["env".into()]).unwrap();
        let std = cmd.as_std();
        assert_eq!(std.get_program(), BWRAP);
        assert!(std.get_args().all(|a| a != "s3cret" && a != "TOKEN=s3cret"));
        let envs: Vec<_> = std.get_envs().collect();
        assert_eq!(
            envs,
            [(
                std::ffi::OsStr::new("TOKEN"),
                Some(std::ffi::OsStr::new("s3cret"))
            )]
        );
    }
}
