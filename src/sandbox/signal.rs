//! Signals kiln forwards into a running sandbox: found through the launcher's child (the
//! sandbox's init process, a session leader), delivered to its process group. Both sandboxes
//! (bwrap and the built-in one) have that process tree.

use std::fmt;
use std::path::Path;

use rustix::process::{Pid, kill_process, kill_process_group};

use super::{Error, Result};

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
    use std::process::Stdio;

    use super::*;

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

    #[test]
    fn signal_numbers_follow_linux() {
        assert_eq!(Signal::Interrupt.number(), 2);
        assert_eq!(Signal::Terminate.number(), 15);
        assert_eq!(Signal::Kill.number(), 9);
        assert_eq!(Signal::Terminate.to_string(), "SIGTERM");
    }
}
