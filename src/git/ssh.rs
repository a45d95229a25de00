//! Git over SSH (`ssh://`, `git@host:path`): gix runs an `ssh` program for the connection, and
//! kiln gives it one that cannot be steered by anything but the Function's Secret. A private
//! directory per connection holds the key (mode 0600), the known hosts when the Secret has
//! them, and an `ssh_config` that names them and turns off everything else OpenSSH would
//! consult or offer (agents, other identities, passwords, the user's and the system's
//! configuration and known hosts, forwarding, multiplexing). gix cannot pass arguments to the
//! program, so the program it runs is a link named `ssh` to this binary: [`dispatch`] sees
//! that name, runs the real `ssh -F DIR/ssh_config …`, keeps its error output for the
//! message, and stops it past the fetch's byte limit. An encrypted key's passphrase reaches
//! OpenSSH through `SSH_ASKPASS`, a link named `askpass` to this binary that prints it.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

use super::Error;
use crate::io_error::IoContext as _;

/// The key of a Kyma git auth Secret of `type: key`: the private key, its passphrase when it
/// is encrypted, and the host keys to trust (`knownHosts`, optional).
#[derive(Clone, PartialEq, Eq)]
pub struct SshKey {
    /// The private key (OpenSSH or PEM), as the Secret holds it.
    pub key: String,
    /// The passphrase of an encrypted key.
    pub passphrase: Option<String>,
    /// `known_hosts` lines: with them, only these host keys are accepted; without, any is
    /// (as Kyma did), and kiln says that the host was not verified.
    pub known_hosts: Option<String>,
}

impl std::fmt::Debug for SshKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SshKey")
            .field("key", &"***")
            .field("passphrase", &self.passphrase.as_ref().map(|_| "***"))
            .field("known_hosts", &self.known_hosts.is_some())
            .finish()
    }
}

/// File names in the connection's directory.
const CONFIG: &str = "ssh_config";
const KEY: &str = "key";
const PASSPHRASE: &str = "passphrase";
const KNOWN_HOSTS: &str = "known_hosts";
const PROGRAM: &str = "program";
const LIMIT: &str = "limit";
const LOG: &str = "ssh.log";
const EXCEEDED: &str = "exceeded";
const STALLED: &str = "stalled";
const TIMEOUT: &str = "timeout";
const PID: &str = "ssh.pid";
/// The most of OpenSSH's error output kept (a server can write to it without end).
const LOG_LIMIT: u64 = 64 << 10;
/// A connection may last this many times the timeout in all, however it trickles.
const DEADLINE_FACTOR: u64 = 10;

/// One connection's private directory; removed (key and all) when dropped.
pub(super) struct SshDir {
    dir: tempfile::TempDir,
}

impl SshDir {
    /// Writes the key, known hosts and configuration for a connection that may receive at
    /// most `limit` bytes, with `timeout` to connect and between keep-alives.
    ///
    /// # Errors
    /// No `ssh` program on `PATH`; the files could not be written.
    pub(super) fn new(
        key: &SshKey,
        limit: u64,
        timeout: std::time::Duration,
    ) -> Result<Self, Error> {
        let program = find_ssh().ok_or(Error::NoSsh)?;
        let dir = tempfile::Builder::new()
            .prefix("kiln-ssh-")
            .tempdir()
            .at("creating a directory in", std::env::temp_dir())?;
        let path = dir.path();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))
            .at("securing", path)?;
        let mut key_text = key.key.replace("\r\n", "\n");
        if !key_text.ends_with('\n') {
            key_text.push('\n'); // OpenSSH refuses a key without its final newline
        }
        private_file(&path.join(KEY), key_text.as_bytes())?;
        if let Some(passphrase) = &key.passphrase {
            private_file(&path.join(PASSPHRASE), passphrase.as_bytes())?;
        }
        let known_hosts = match &key.known_hosts {
            Some(lines) => {
                private_file(&path.join(KNOWN_HOSTS), lines.as_bytes())?;
                Some(path.join(KNOWN_HOSTS))
            }
            None => None,
        };
        let config = config_text(path, known_hosts.as_deref(), timeout);
        private_file(&path.join(CONFIG), config.as_bytes())?;
        private_file(&path.join(PROGRAM), program.as_os_str().as_encoded_bytes())?;
        private_file(&path.join(LIMIT), format!("0 {limit}").as_bytes())?;
        private_file(
            &path.join(TIMEOUT),
            timeout.as_secs().max(1).to_string().as_bytes(),
        )?;
        let exe = std::env::current_exe().at("finding", "the kiln executable")?;
        for name in ["ssh", "askpass"] {
            std::os::unix::fs::symlink(&exe, path.join(name)).at("linking", path.join(name))?;
        }
        Ok(SshDir { dir })
    }

    /// The program gix runs: the link named `ssh`.
    pub(super) fn program(&self) -> PathBuf {
        self.dir.path().join("ssh")
    }

    /// From now on the connection may receive `limit` more bytes (the pack after the listing:
    /// [`super::capped::Budget::restart`] for SSH). The `ssh` link reads the file as it copies.
    pub(super) fn restart(&self, limit: u64) -> Result<(), Error> {
        let path = self.dir.path().join(LIMIT);
        let next = self.dir.path().join("limit.next");
        let generation = std::fs::read_to_string(&path)
            .ok()
            .and_then(|t| t.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0);
        private_file(&next, format!("{} {limit}", generation + 1).as_bytes())?;
        std::fs::rename(&next, &path).at("replacing", &path)?;
        Ok(())
    }

    /// Whether the connection stopped at the byte limit.
    pub(super) fn exceeded(&self) -> bool {
        self.dir.path().join(EXCEEDED).exists()
    }

    /// What OpenSSH said on its error output (the last lines, each cut to 300 characters),
    /// for the error message; or that the connection stalled.
    pub(super) fn said(&self) -> String {
        if let Ok(text) = std::fs::read_to_string(self.dir.path().join(STALLED)) {
            return text;
        }
        let bytes = std::fs::read(self.dir.path().join(LOG)).unwrap_or_default();
        let text = String::from_utf8_lossy(&bytes[bytes.len().saturating_sub(8192)..]);
        let lines: Vec<String> = text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| l.chars().take(300).collect())
            .collect();
        lines[lines.len().saturating_sub(3)..].join("; ")
    }
}

impl Drop for SshDir {
    /// gix kills the `ssh` link's process when the connection ends, which orphans the real
    /// `ssh` (it ends when its pipes close). An orphan is the init process's to reap: when
    /// that is kiln (PID 1 in the controller's container), reap it here, or each connection
    /// would leave a zombie behind.
    fn drop(&mut self) {
        let Ok(text) = std::fs::read_to_string(self.dir.path().join(PID)) else {
            return; // the link reaped it itself
        };
        let Some(pid) = text
            .trim()
            .parse()
            .ok()
            .and_then(rustix::process::Pid::from_raw)
        else {
            return;
        };
        if std::process::id() != 1 {
            return; // the machine's init reaps it
        }
        for _ in 0..50 {
            match rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::NOHANG) {
                Ok(Some(_)) => return,
                Ok(None) => {
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                    let _ =
                        rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty());
                    return;
                }
                // Not (yet) ours: the link is still dying.
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(2)),
            }
        }
    }
}

/// The `ssh_config` of a connection: only what kiln wrote counts (`-F` replaces the user's and
/// the system's files).
fn config_text(dir: &Path, known_hosts: Option<&Path>, timeout: std::time::Duration) -> String {
    let quoted = |p: &Path| format!("\"{}\"", p.display());
    let mut text = String::from("Host *\n");
    let mut set = |name: &str, value: &str| {
        let _ = writeln!(text, "  {name} {value}");
    };
    set("IdentityFile", &quoted(&dir.join(KEY)));
    set("IdentitiesOnly", "yes");
    set("IdentityAgent", "none");
    set("PreferredAuthentications", "publickey");
    set("PasswordAuthentication", "no");
    set("KbdInteractiveAuthentication", "no");
    set("NumberOfPasswordPrompts", "1");
    match known_hosts {
        Some(file) => {
            set("StrictHostKeyChecking", "yes");
            set("UserKnownHostsFile", &quoted(file));
        }
        None => {
            set("StrictHostKeyChecking", "no");
            set("UserKnownHostsFile", "/dev/null");
        }
    }
    set("GlobalKnownHostsFile", "/dev/null");
    set("CheckHostIP", "no");
    set("UpdateHostKeys", "no");
    set("ConnectTimeout", &timeout.as_secs().max(1).to_string());
    set("ServerAliveInterval", "15");
    set(
        "ServerAliveCountMax",
        &(timeout.as_secs() / 15).max(1).to_string(),
    );
    set("ControlMaster", "no");
    set("ControlPath", "none");
    set("ForwardAgent", "no");
    set("ForwardX11", "no");
    set("ClearAllForwardings", "yes");
    set("PermitLocalCommand", "no");
    set("ProxyCommand", "none");
    set("ProxyJump", "none");
    set("LogLevel", "ERROR");
    text
}

fn private_file(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .at("creating", path)?;
    file.write_all(bytes).at("writing", path)?;
    Ok(())
}

/// The `ssh` program on `PATH`.
fn find_ssh() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|dir| dir.join("ssh"))
        .find(|p| p.is_file())
}

/// Runs the `ssh` or `askpass` role when this binary was started as one of a connection
/// directory's links; `None` otherwise. Call it first thing in `main`.
pub fn dispatch(args: &[OsString]) -> Option<ExitCode> {
    let argv0 = Path::new(args.first()?);
    let dir = argv0.parent()?;
    if !dir.join(CONFIG).is_file() {
        return None;
    }
    match argv0.file_name()?.to_str()? {
        "askpass" => Some(askpass(dir)),
        "ssh" => Some(run_ssh(dir, &args[1..])),
        _ => None,
    }
}

/// `SSH_ASKPASS`: prints the passphrase of the key.
fn askpass(dir: &Path) -> ExitCode {
    match std::fs::read(dir.join(PASSPHRASE)) {
        Ok(passphrase) => {
            let mut out = std::io::stdout();
            let _ = out.write_all(&passphrase);
            let _ = out.write_all(b"\n");
            ExitCode::SUCCESS
        }
        Err(_) => ExitCode::FAILURE,
    }
}

/// The real `ssh -F DIR/ssh_config ARGS…`: its output passed on up to the limit, its error
/// output kept in the directory.
fn run_ssh(dir: &Path, args: &[OsString]) -> ExitCode {
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap_or_default();
    let program = read(PROGRAM);
    // "GENERATION LIMIT": a new generation (the pack after the listing) starts a new count.
    let limit_now = || {
        let text = read(LIMIT);
        let mut parts = text.split_whitespace();
        let generation = parts.next().unwrap_or("").to_string();
        (
            generation,
            parts
                .next()
                .and_then(|l| l.parse::<u64>().ok())
                .unwrap_or(0),
        )
    };
    let (mut generation, mut limit) = limit_now();
    let Ok(log) = std::fs::File::create(dir.join(LOG)) else {
        return ExitCode::FAILURE;
    };
    let timeout = std::time::Duration::from_secs(read(TIMEOUT).trim().parse().unwrap_or(60));
    let mut command = Command::new(program);
    command
        .arg("-F")
        .arg(dir.join(CONFIG))
        .args(args)
        .stdin(Stdio::inherit())
        .stdout(Stdio::piped())
        .stderr(log);
    // ssh inherits this: it cannot write more than LOG_LIMIT of error output (SIGXFSZ ends it
    // past that). This process writes only its few small files.
    let cap = rustix::process::Rlimit {
        current: Some(LOG_LIMIT),
        maximum: Some(LOG_LIMIT),
    };
    if rustix::process::setrlimit(rustix::process::Resource::Fsize, cap).is_err() {
        return ExitCode::FAILURE;
    }
    if dir.join(PASSPHRASE).is_file() {
        command
            .env("SSH_ASKPASS", dir.join("askpass"))
            .env("SSH_ASKPASS_REQUIRE", "force")
            .env("DISPLAY", ":0");
    } else {
        command
            .env_remove("SSH_ASKPASS")
            .env_remove("SSH_AUTH_SOCK");
    }
    let Ok(mut child) = command.spawn() else {
        return ExitCode::FAILURE;
    };
    let _ = std::fs::write(dir.join(PID), child.id().to_string());
    let progress = watch_progress(dir, child.id(), timeout);
    let mut from = child.stdout.take().expect("piped");
    let mut to = std::io::stdout().lock();
    let mut buf = vec![0; 64 << 10];
    let mut total = 0u64;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let (now, new_limit) = limit_now();
        if now != generation {
            (generation, limit, total) = (now, new_limit, 0);
        }
        progress.store(now_ms(), std::sync::atomic::Ordering::Relaxed);
        total += n as u64;
        if total > limit {
            let _ = std::fs::write(dir.join(EXCEEDED), b"");
            let _ = child.kill();
            let _ = child.wait();
            return ExitCode::FAILURE;
        }
        if to.write_all(&buf[..n]).and_then(|()| to.flush()).is_err() {
            break;
        }
    }
    let status = child.wait();
    let _ = std::fs::remove_file(dir.join(PID)); // reaped
    match status {
        Ok(status) => ExitCode::from(u8::try_from(status.code().unwrap_or(1)).unwrap_or(1)),
        Err(_) => ExitCode::FAILURE,
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Stops `ssh` (process `pid`) when nothing arrives for `timeout`, or when the connection
/// has lasted [`DEADLINE_FACTOR`] times that in all (a server that trickles a byte now and
/// then), as the HTTP client's timeouts do; says so in the directory. Returns the clock the
/// copy loop sets on every read.
fn watch_progress(
    dir: &Path,
    pid: u32,
    timeout: std::time::Duration,
) -> std::sync::Arc<std::sync::atomic::AtomicU64> {
    use std::sync::atomic::Ordering;
    let progress = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(now_ms()));
    let (clock, dir) = (std::sync::Arc::clone(&progress), dir.to_path_buf());
    let idle_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
    let deadline = now_ms().saturating_add(idle_ms.saturating_mul(DEADLINE_FACTOR));
    std::thread::spawn(move || {
        loop {
            std::thread::sleep(std::time::Duration::from_millis(200));
            let now = now_ms();
            let idle = now.saturating_sub(clock.load(Ordering::Relaxed));
            let why = if idle > idle_ms {
                format!("no data for {} s: the connection stalled", idle_ms / 1000)
            } else if now > deadline {
                format!(
                    "the connection took over {} s (the git timeout, {} s, times \
                     {DEADLINE_FACTOR})",
                    idle_ms.saturating_mul(DEADLINE_FACTOR) / 1000,
                    idle_ms / 1000
                )
            } else {
                continue;
            };
            let _ = std::fs::write(dir.join(STALLED), why);
            if let Some(pid) = i32::try_from(pid)
                .ok()
                .and_then(rustix::process::Pid::from_raw)
            {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
            return;
        }
    });
    progress
}

/// What OpenSSH's words mean, for the error: the host key, the key, or the network.
pub(super) fn classify(said: &str, url: &str, verified: bool) -> Option<Error> {
    let has = |needle: &str| said.contains(needle);
    if has("Host key verification failed")
        || has("REMOTE HOST IDENTIFICATION HAS CHANGED")
        || has("No matching host key")
        || has("host key is known")
    {
        return Some(Error::HostKeyMismatch {
            url: url.to_string(),
            said: said.to_string(),
            verified,
        });
    }
    if has("Permission denied") || has("incorrect passphrase") || has("invalid format") {
        return Some(Error::KeyRejected {
            url: url.to_string(),
            said: said.to_string(),
        });
    }
    if has("the connection stalled") || has("the connection took over") {
        return Some(Error::SshUnreachable {
            url: url.to_string(),
            said: said.to_string(),
        });
    }
    if has("Could not resolve hostname")
        || has("Connection refused")
        || has("timed out")
        || has("No route to host")
        || has("Connection closed")
    {
        return Some(Error::SshUnreachable {
            url: url.to_string(),
            said: said.to_string(),
        });
    }
    None
}
