//! Rootless sandboxes around an unpacked root filesystem, for `kiln run` and sandboxed
//! dependency installs: the description ([`Sandbox`]), the choice of how to run it (bubblewrap
//! when installed, else kiln's own [`builtin`] one on util-linux `unshare`), a check that user
//! namespaces are usable, and signal forwarding into a running sandbox. It reads only
//! `PATH` and [`BACKEND_ENV`] and never prints.

pub mod builtin;

use std::ffi::OsString;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;

use rustix::process::{Pid, kill_process, kill_process_group};
use serde::{Deserialize, Serialize};

use builtin::Builtin;

/// The bubblewrap program, looked up on `PATH`.
pub const BWRAP: &str = "bwrap";

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

    fn flag(&self) -> &'static str {
        match (self.writable, self.optional) {
            (true, false) => "--bind",
            (true, true) => "--bind-try",
            (false, false) => "--ro-bind",
            (false, true) => "--ro-bind-try",
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
        }
    }

    /// The `bwrap` arguments that run `argv` in this sandbox.
    pub fn args(&self, argv: &[String]) -> Vec<OsString> {
        let mut args: Vec<OsString> = Vec::new();
        let mut push = |items: &[&str]| args.extend(items.iter().map(OsString::from));
        let (uid, gid) = (self.uid.to_string(), self.gid.to_string());
        push(&["--unshare-user", "--uid", &uid, "--gid", &gid]);
        push(&["--unshare-pid", "--unshare-ipc", "--unshare-uts"]);
        if !self.share_network {
            push(&["--unshare-net"]);
        }
        if let Some(name) = &self.hostname {
            push(&["--hostname", name]);
        }
        push(&["--die-with-parent"]);
        if self.new_session {
            push(&["--new-session"]);
        }
        // Without this bwrap keeps every capability (inside the user namespace) for uid 0.
        push(&["--cap-drop", "ALL"]);
        // The root is bound writable and remounted read-only at the end: bwrap has to create
        // missing mount points, which a read-only bind would refuse.
        args.extend(["--bind".into(), self.rootfs.clone().into(), "/".into()]);
        let mut push = |items: &[&str]| args.extend(items.iter().map(OsString::from));
        push(&["--proc", "/proc", "--dev", "/dev"]);
        for dir in &self.tmpfs {
            push(&["--tmpfs", dir]);
        }
        for bind in &self.binds {
            args.extend([
                bind.flag().into(),
                bind.source.clone().into(),
                bind.dest.clone().into(),
            ]);
        }
        let mut push = |items: &[&str]| args.extend(items.iter().map(OsString::from));
        if self.read_only_root {
            push(&["--remount-ro", "/"]);
        }
        push(&["--chdir", &self.cwd, "--"]);
        args.extend(argv.iter().map(OsString::from));
        args
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
    pub fn command(&self, argv: &[String]) -> tokio::process::Command {
        let mut cmd = match CHOSEN.get() {
            Some(Backend::Builtin(builtin)) => {
                let mut line = builtin.argv(self, argv).into_iter();
                let mut cmd = tokio::process::Command::new(line.next().unwrap_or_default());
                cmd.args(line);
                cmd
            }
            Some(Backend::Bwrap) | None => {
                let mut cmd = tokio::process::Command::new(BWRAP);
                cmd.args(self.args(argv));
                cmd
            }
        };
        cmd.env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .process_group(0)
            .kill_on_drop(true);
        cmd
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
        "" | "auto" => match probe(BWRAP).await {
            Ok(()) => Backend::Bwrap,
            Err(Error::Missing { .. }) => {
                tracing::info!("bubblewrap is not installed: using kiln's built-in sandbox");
                builtin().await?
            }
            Err(e) => return Err(e),
        },
        "bwrap" => probe(BWRAP).await.map(|()| Backend::Bwrap)?,
        "builtin" => {
            tracing::info!("{BACKEND_ENV}=builtin: using kiln's built-in sandbox");
            builtin().await?
        }
        other => return Err(Error::UnknownBackend(other.to_string())),
    };
    tracing::debug!(?backend, "sandbox chosen");
    Ok(CHOSEN.get_or_init(|| backend).clone())
}

async fn probe(program: &str) -> Result<()> {
    let output = tokio::process::Command::new(program)
        .args([
            "--unshare-user",
            "--ro-bind",
            "/",
            "/",
            program,
            "--version",
        ])
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|source| match source.kind() {
            io::ErrorKind::NotFound => Error::Missing {
                program: program.into(),
            },
            _ => Error::Spawn {
                program: program.into(),
                source,
            },
        })?;
    if output.status.success() {
        return Ok(());
    }
    Err(Error::NoUserNamespaces {
        program: BWRAP,
        stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
    })
}

/// A signal kiln forwards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    /// `SIGINT` (Ctrl-C).
    Interrupt,
    /// `SIGTERM`.
    Terminate,
    /// `SIGKILL`.
    Kill,
}

impl Signal {
    /// The signal number, as in the `128 + n` exit code of a process it killed.
    pub fn number(self) -> u8 {
        match self {
            Signal::Interrupt => 2,
            Signal::Kill => 9,
            Signal::Terminate => 15,
        }
    }

    fn to_rustix(self) -> rustix::process::Signal {
        match self {
            Signal::Interrupt => rustix::process::Signal::INT,
            Signal::Terminate => rustix::process::Signal::TERM,
            Signal::Kill => rustix::process::Signal::KILL,
        }
    }
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Signal::Interrupt => "SIGINT",
            Signal::Terminate => "SIGTERM",
            Signal::Kill => "SIGKILL",
        })
    }
}

/// Where [`forward_signal`] delivered a signal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// To the sandbox's process group (every process of the sandbox that kept it).
    Sandbox {
        /// The group: the host pid of bwrap's init process in the sandbox.
        pgid: u32,
    },
    /// To the launcher (bwrap or unshare) itself, because the sandbox was not set up yet; it
    /// dies and the sandbox with it.
    Launcher,
    /// Nowhere: the sandbox has already exited.
    Gone,
}

/// Sends `signal` to the processes of the sandbox whose launcher (`bwrap`, or `unshare` for
/// the built-in sandbox) has host pid `launcher`.
///
/// bwrap does not forward signals itself. With `--unshare-pid` its child is an init process
/// (pid 1 inside) that called `setsid()`, so its pid is also the process group of the
/// sandboxed program, which is signalled like a terminal's Ctrl-C would. The init process
/// itself ignores it: pid-namespace init processes only get signals they handle.
///
/// # Errors
/// [`Error::Signal`] when `kill(2)` fails for another reason than the process being gone.
pub fn forward_signal(launcher: u32, signal: Signal) -> Result<Delivery> {
    let sig = signal.to_rustix();
    let gone = |e: &rustix::io::Errno| *e == rustix::io::Errno::SRCH;
    let err = |pid, e: rustix::io::Errno| Error::Signal {
        signal,
        pid,
        source: e.into(),
    };
    if let Some(init) = children(launcher).into_iter().next()
        && let Some(pid) = Pid::from_raw(init as i32)
    {
        match kill_process_group(pid, sig) {
            Ok(()) => return Ok(Delivery::Sandbox { pgid: init }),
            // No such group yet: the init process is still setting up (before `setsid`).
            Err(e) if gone(&e) => {}
            Err(e) => return Err(err(init, e)),
        }
    }
    let Some(pid) = Pid::from_raw(launcher as i32) else {
        return Ok(Delivery::Gone);
    };
    match kill_process(pid, sig) {
        Ok(()) => Ok(Delivery::Launcher),
        Err(e) if gone(&e) => Ok(Delivery::Gone),
        Err(e) => Err(err(launcher, e)),
    }
}

/// The pids of `pid`'s children: from `/proc/PID/task/PID/children` when the kernel has it
/// (`CONFIG_PROC_CHILDREN`), else by scanning `/proc/*/stat` for the parent pid.
fn children(pid: u32) -> Vec<u32> {
    let list = Path::new("/proc").join(format!("{pid}/task/{pid}/children"));
    match std::fs::read_to_string(list) {
        Ok(text) => text
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect(),
        Err(_) => children_by_scan(pid),
    }
}

fn children_by_scan(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|child| {
            std::fs::read_to_string(format!("/proc/{child}/stat"))
                .is_ok_and(|stat| parent_pid(&stat) == Some(pid))
        })
        .collect()
}

/// The parent pid field of a `/proc/PID/stat` line: `pid (comm) state ppid …`, where `comm`
/// may itself contain spaces and parentheses.
fn parent_pid(stat: &str) -> Option<u32> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(args: Vec<OsString>) -> Vec<String> {
        args.into_iter().map(|a| a.into_string().unwrap()).collect()
    }

    #[test]
    fn a_default_sandbox_is_read_only_without_network_and_drops_capabilities() {
        let args = strings(Sandbox::new("/cache/rootfs").args(&["/bin/sh".into(), "-c".into()]));
        let expected = [
            "--unshare-user",
            "--uid",
            "0",
            "--gid",
            "0",
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-net",
            "--die-with-parent",
            "--new-session",
            "--cap-drop",
            "ALL",
            "--bind",
            "/cache/rootfs",
            "/",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--tmpfs",
            "/tmp",
            "--remount-ro",
            "/",
            "--chdir",
            "/",
            "--",
            "/bin/sh",
            "-c",
        ];
        assert_eq!(args, expected);
    }

    #[test]
    fn binds_user_and_network_appear_in_the_arguments() {
        let sandbox = Sandbox {
            binds: vec![
                Bind::read_only("/etc/resolv.conf", "/etc/resolv.conf").optional(),
                Bind::writable("/work/out", "/out"),
                Bind::read_only("/ca.pem", "/etc/ssl/ca.pem"),
            ],
            tmpfs: vec![],
            uid: 1000,
            gid: 100,
            share_network: true,
            read_only_root: false,
            hostname: Some("fn".into()),
            new_session: false,
            cwd: "/app".into(),
            ..Sandbox::new("/r")
        };
        let args = strings(sandbox.args(&["node".into()]));
        let joined = args.join(" ");
        assert!(joined.starts_with("--unshare-user --uid 1000 --gid 100 "));
        assert!(!args.contains(&"--unshare-net".to_string()));
        assert!(!args.contains(&"--new-session".to_string()));
        assert!(!args.contains(&"--remount-ro".to_string()));
        assert!(!args.contains(&"--tmpfs".to_string()));
        assert!(joined.contains("--hostname fn "));
        assert!(joined.contains("--cap-drop ALL --bind /r / "));
        assert!(joined.contains(
            "--ro-bind-try /etc/resolv.conf /etc/resolv.conf --bind /work/out /out \
             --ro-bind /ca.pem /etc/ssl/ca.pem --chdir /app -- node"
        ));
    }

    #[test]
    fn the_environment_goes_to_bwrap_and_not_into_its_arguments() {
        let sandbox = Sandbox {
            env: vec![("TOKEN".into(), "s3cret".into())],
            ..Sandbox::new("/r")
        };
        let cmd = sandbox.command(&["env".into()]);
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

    #[test]
    fn the_parent_pid_is_read_after_the_command_name() {
        assert_eq!(parent_pid("42 (a) b) c) S 7 42 42 0"), Some(7));
        assert_eq!(parent_pid("1 (init) S 0 1 1"), Some(0));
        assert_eq!(parent_pid("garbage"), None);
    }

    #[test]
    fn the_children_of_a_process_are_found_both_ways() {
        let mut sh = std::process::Command::new("sh")
            .args(["-c", "sleep 5 & wait"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut found = children(sh.id());
        while found.is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
            found = children(sh.id());
        }
        let scanned = children_by_scan(sh.id());
        for pid in &found {
            kill_process(
                Pid::from_raw(*pid as i32).unwrap(),
                Signal::Kill.to_rustix(),
            )
            .unwrap();
        }
        sh.kill().unwrap();
        sh.wait().unwrap();
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(scanned, found);
    }

    #[tokio::test]
    async fn a_missing_bwrap_names_the_debian_package_and_a_failing_probe_is_explained() {
        let missing = probe("/nonexistent/bwrap").await.unwrap_err();
        assert!(
            missing.to_string().contains("Debian package `bubblewrap`"),
            "{missing}"
        );
        let refused = probe("false").await.unwrap_err();
        assert!(
            matches!(refused, Error::NoUserNamespaces { .. }),
            "{refused:?}"
        );
        assert!(refused.to_string().contains("user.max_user_namespaces"));
    }

    #[tokio::test]
    async fn bwrap_is_usable_here() {
        check_available().await.unwrap();
    }

    #[test]
    fn signal_numbers_follow_linux() {
        assert_eq!(Signal::Interrupt.number(), 2);
        assert_eq!(Signal::Terminate.number(), 15);
        assert_eq!(Signal::Kill.number(), 9);
        assert_eq!(Signal::Terminate.to_string(), "SIGTERM");
    }
}
