//! One container as one `kiln run` process: its command line (image, `--user`,
//! `--entrypoint`, `--env`, `--volume`, the kubelet's registry arguments), its stdout and
//! stderr in one log file, stopping it (SIGTERM, which kiln forwards, then SIGKILL after the
//! grace period), and its end: exit code, reason and termination message.

use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;

/// The most the kubelet reads from a termination-message file.
pub const MAX_MESSAGE: u64 = 4096;
/// `FallbackToLogsOnError` takes at most this many bytes and lines of the log's tail.
const FALLBACK_BYTES: usize = 2048;
const FALLBACK_LINES: usize = 80;

/// Everything needed to start one container.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The container's name.
    pub name: String,
    /// The image reference, as the pod spec gives it.
    pub image: String,
    /// The `kiln` arguments (starting with `run`).
    pub args: Vec<String>,
    /// Where stdout and stderr go (appended: a restarted container continues it).
    pub log: PathBuf,
    /// The host file bound at the container's terminationMessagePath.
    pub termination_file: PathBuf,
    /// `terminationMessagePolicy: FallbackToLogsOnError`.
    pub fallback_to_logs: bool,
}

/// How a container ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exit {
    /// The exit code (128 + N when signal N ended it).
    pub code: i32,
    /// `Completed` for 0, else `Error`.
    pub reason: String,
    /// The termination message, if any.
    pub message: Option<String>,
    /// When it started.
    pub started_at: Timestamp,
    /// When it ended.
    pub finished_at: Timestamp,
}

/// A running `kiln run`.
#[derive(Debug)]
pub struct Process {
    child: Child,
    plan: Plan,
    /// When it started.
    pub started_at: Timestamp,
}

impl Process {
    /// Starts `plan` with the `kiln` binary, in `sandbox` (`KILN_SANDBOX`) when given, with a
    /// clean environment: kiln sees only `PATH`, `HOME` and an empty docker config under
    /// `home`, never the host's credentials.
    pub fn start(
        kiln: &Path,
        sandbox: Option<&str>,
        home: &Path,
        plan: &Plan,
    ) -> std::io::Result<Process> {
        if let Some(dir) = plan.log.parent() {
            fs::create_dir_all(dir)?;
        }
        let log = File::options().create(true).append(true).open(&plan.log)?;
        let docker = home.join("docker");
        fs::create_dir_all(&docker)?;
        let mut cmd = Command::new(kiln);
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", home)
            .env("DOCKER_CONFIG", &docker)
            .arg("-q")
            .args(&plan.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        if let Some(sandbox) = sandbox {
            cmd.env("KILN_SANDBOX", sandbox);
        }
        let child = cmd.spawn()?;
        Ok(Process {
            child,
            plan: plan.clone(),
            started_at: Timestamp::now(),
        })
    }

    /// The exit, once the process has ended.
    pub fn try_exit(&mut self) -> Option<Exit> {
        let status = self.child.try_wait().ok()??;
        Some(self.exit(status))
    }

    /// Sends SIGTERM (kiln forwards it into the sandbox), waits up to `grace`, then SIGKILLs
    /// kiln (whose sandbox dies with it) and returns the exit.
    pub fn stop(&mut self, grace: Duration) -> Exit {
        let pid = rustix::process::Pid::from_child(&self.child);
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Some(exit) = self.try_exit() {
                return exit;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let status = self.child.wait();
        match status {
            Ok(status) => self.exit(status),
            Err(_) => self.exit_with(137),
        }
    }

    fn exit(&self, status: std::process::ExitStatus) -> Exit {
        use std::os::unix::process::ExitStatusExt;
        let code = status
            .code()
            .or(status.signal().map(|s| 128 + s))
            .unwrap_or(1);
        self.exit_with(code)
    }

    fn exit_with(&self, code: i32) -> Exit {
        let mut message = read_message(&self.plan.termination_file);
        if message.is_empty() && code != 0 && self.plan.fallback_to_logs {
            message = log_tail(&self.plan.log);
        }
        Exit {
            code,
            reason: if code == 0 { "Completed" } else { "Error" }.into(),
            message: (!message.is_empty()).then_some(message),
            started_at: self.started_at,
            finished_at: Timestamp::now(),
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The first [`MAX_MESSAGE`] bytes of the termination-message file.
fn read_message(path: &Path) -> String {
    let mut bytes = Vec::new();
    if let Ok(file) = File::open(path) {
        let _ = file.take(MAX_MESSAGE).read_to_end(&mut bytes);
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The last [`FALLBACK_LINES`] lines of the log, at most [`FALLBACK_BYTES`] bytes.
fn log_tail(path: &Path) -> String {
    let Ok(mut file) = File::open(path) else {
        return String::new();
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let start = len.saturating_sub(FALLBACK_BYTES as u64);
    let mut bytes = Vec::new();
    if file.seek(SeekFrom::Start(start)).is_err() || file.read_to_end(&mut bytes).is_err() {
        return String::new();
    }
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().collect();
    let keep = lines.len().saturating_sub(FALLBACK_LINES);
    let mut tail = lines[keep..].join("\n");
    if text.ends_with('\n') && !tail.is_empty() {
        tail.push('\n');
    }
    tail
}
