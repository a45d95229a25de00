//! A private network with one door: a bubblewrap sandbox gets its own network namespace
//! (nothing but loopback), and kiln puts one TCP listener on that loopback before the program
//! starts. kiln accepts on it from outside; whatever serves those connections (an allowlisting
//! proxy, for dependency installs) is the sandbox's only way out.
//!
//! How the listener gets there, under bubblewrap: bwrap reports the sandbox's host pid on
//! `--info-fd` and waits on `--block-fd` before it runs the program. kiln then starts itself
//! as a short-lived helper ([`dispatch`]) that joins the sandbox's user namespace (the caller
//! owns it, so that needs no privilege) and then its network namespace, binds the listener
//! there, hands the socket back over a Unix socket (`SCM_RIGHTS`) and exits; kiln unblocks
//! the sandbox. In kiln's built-in sandbox the init process (kiln itself, inside the
//! namespaces) brings the loopback up, binds the listener and sends it to the [`Door`] (a
//! Unix socket kiln listens on) before it starts the program. No binary enters the sandbox
//! and the root filesystem is not touched.

use std::ffi::OsString;
use std::fs::File;
use std::io::{self, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::process::ExitCode;

use rustix::io::FdFlags;
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketFlags, SocketType,
};
use rustix::pipe::PipeFlags;

use super::{BWRAP, Sandbox};

/// The hidden first argument that makes `kiln` the helper.
const HELPER: &str = "__kiln-netns-listen";

/// A sandbox command about to be spawned, and what kiln needs to open its door.
#[derive(Debug)]
pub struct Gate {
    port: u16,
    how: How,
}

#[derive(Debug)]
enum How {
    Bwrap {
        /// Read by kiln: bwrap's JSON with the child's pid.
        info: File,
        /// Written by kiln once the listener is in place.
        block: File,
        /// The ends bwrap inherits; closed in kiln once it runs.
        child_ends: Vec<OwnedFd>,
    },
    Builtin {
        /// Where the init connects to; in a directory removed with it.
        door: std::os::unix::net::UnixListener,
        _dir: tempfile::TempDir,
    },
}

/// Where the built-in sandbox's init sends its listener: a Unix socket path and the port.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Door {
    /// The Unix socket kiln accepts on.
    pub socket: std::path::PathBuf,
    /// The loopback port to listen on inside.
    pub port: u16,
}

/// `sandbox` (which must not share the host network) running `argv`, gated: the program
/// starts only once its network has the listener ([`Gate::open`]).
///
/// # Errors
/// When the pipes or the door cannot be made.
pub fn command(
    sandbox: &Sandbox,
    argv: &[String],
    port: u16,
) -> io::Result<(tokio::process::Command, Gate)> {
    if let Some(super::Backend::Builtin(_)) = super::chosen() {
        let dir = tempfile::Builder::new().prefix("kiln-gate-").tempdir()?;
        let socket = dir.path().join("door");
        let door = std::os::unix::net::UnixListener::bind(&socket)?;
        let mut sandbox = sandbox.clone();
        sandbox.gate = Some(Door { socket, port });
        let gate = Gate {
            port,
            how: How::Builtin { door, _dir: dir },
        };
        return Ok((sandbox.command(argv).map_err(io::Error::other)?, gate));
    }
    // Inheritable (no close-on-exec), so bwrap gets them without any code between fork and
    // exec; kiln closes its copies of bwrap's ends as soon as bwrap runs.
    let (info_read, info_write) = rustix::pipe::pipe_with(PipeFlags::empty())?;
    let (block_read, block_write) = rustix::pipe::pipe_with(PipeFlags::empty())?;
    let (info_read, block_write) = (cloexec(info_read)?, cloexec(block_write)?);
    let mut line: Vec<OsString> = vec![
        BWRAP.into(),
        "--info-fd".into(),
        info_write.as_raw_fd().to_string().into(),
        "--block-fd".into(),
        block_read.as_raw_fd().to_string().into(),
    ];
    line.extend(super::bwrap::args(sandbox, argv).map_err(io::Error::other)?);
    let mut line = sandbox.emulated(line).into_iter();
    let mut cmd = tokio::process::Command::new(line.next().unwrap_or_default());
    cmd.args(line)
        .env_clear()
        .envs(sandbox.env.iter().map(|(k, v)| (k, v)))
        .process_group(0)
        .kill_on_drop(true);
    let gate = Gate {
        port,
        how: How::Bwrap {
            info: File::from(info_read),
            block: File::from(block_write),
            child_ends: vec![info_write, block_read],
        },
    };
    Ok((cmd, gate))
}

/// Marks kiln's own end of a pipe close-on-exec.
fn cloexec(fd: OwnedFd) -> io::Result<OwnedFd> {
    rustix::io::fcntl_setfd(&fd, FdFlags::CLOEXEC)?;
    Ok(fd)
}

impl Gate {
    /// Puts the listener into the network of the sandbox `child` (spawned from this gate's
    /// command), lets its program start and returns the listener (on the sandbox's
    /// `127.0.0.1:port`). When the listener cannot be placed, `child` is killed while its
    /// program is still held back: a sandbox never runs its program without its door.
    ///
    /// # Errors
    /// When bwrap says nothing (it failed: its stderr says why), or the helper fails.
    pub async fn open(
        self,
        child: &mut tokio::process::Child,
    ) -> io::Result<std::net::TcpListener> {
        self.open_with(child, place_listener).await
    }

    /// [`Gate::open`], with `place` putting a listener on `port` into the network of the
    /// sandbox whose host pid it gets.
    async fn open_with(
        self,
        child: &mut tokio::process::Child,
        place: fn(i32, u16) -> io::Result<OwnedFd>,
    ) -> io::Result<std::net::TcpListener> {
        let port = self.port;
        let (placed, held) = match self.how {
            How::Bwrap {
                mut info,
                block,
                child_ends,
            } => {
                drop(child_ends);
                let pid = tokio::task::spawn_blocking(move || child_pid(&mut info))
                    .await
                    .map_err(io::Error::other)
                    .flatten();
                let (pid, placed) = match pid {
                    Ok(pid) => {
                        let placed = tokio::task::spawn_blocking(move || place(pid, port));
                        (Some(pid), placed.await.map_err(io::Error::other).flatten())
                    }
                    Err(e) => (None, Err(e)),
                };
                (placed, Some((pid, block)))
            }
            How::Builtin { door, _dir } => {
                let placed = tokio::task::spawn_blocking(move || receive_from_init(&door));
                (placed.await.map_err(io::Error::other).flatten(), None)
            }
        };
        match (placed, held) {
            (Ok(listener), held) => {
                if let Some((_, mut block)) = held {
                    block.write_all(b"1")?;
                }
                Ok(std::net::TcpListener::from(listener))
            }
            (Err(e), held) => {
                // The sandbox waits on `block` until it is written or closed, and killing
                // bwrap does not stop it yet (bwrap asks for its parent-death signal only
                // after the wait): kill the sandbox itself, then bwrap, then close.
                if let Some((Some(pid), _)) = &held
                    && let Some(pid) = rustix::process::Pid::from_raw(*pid)
                {
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                }
                let _ = child.kill().await;
                drop(held);
                Err(e)
            }
        }
    }
}

/// Starts the helper ([`dispatch`]) for the sandbox whose host pid is `pid` and returns the
/// listener it bound on `127.0.0.1:port` there.
fn place_listener(pid: i32, port: u16) -> io::Result<OwnedFd> {
    let (ours, theirs) = rustix::net::socketpair(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )?;
    // The helper sends the listener over its stdout, which is our socket.
    let mut helper = std::process::Command::new("/proc/self/exe");
    helper
        .arg(HELPER)
        .arg(pid.to_string())
        .arg(port.to_string())
        .env_clear()
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::from(theirs));
    let output = helper.output()?;
    if !output.status.success() {
        return Err(io::Error::other(format!(
            "putting a listener into the sandbox's network: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    receive_fd(&ours)
}

/// Waits (at most a minute: the init does this first thing) for the built-in sandbox's init
/// to send its listener through `door`.
fn receive_from_init(door: &std::os::unix::net::UnixListener) -> io::Result<OwnedFd> {
    door.set_nonblocking(true)?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let stream = loop {
        match door.accept() {
            Ok((stream, _)) => break stream,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if std::time::Instant::now() > deadline {
                    return Err(io::Error::other(
                        "the sandbox's init never sent its listener",
                    ));
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            Err(e) => return Err(e),
        }
    };
    stream.set_nonblocking(false)?;
    receive_fd(&OwnedFd::from(stream))
}

/// In the built-in sandbox's init, inside its fresh network namespace with capabilities still
/// held: brings the loopback up, listens on `127.0.0.1:port` and sends the socket to `door`.
///
/// # Errors
/// When any step fails.
pub fn send_from_init(door: &Door) -> io::Result<()> {
    loopback_up()?;
    let listener = std::net::TcpListener::bind(("127.0.0.1", door.port))?;
    let stream = std::os::unix::net::UnixStream::connect(&door.socket)?;
    send_fd(stream.as_fd(), listener.as_fd())
}

/// Sets `IFF_UP` on interface 1 (`lo`, in a fresh network namespace) with one
/// `RTM_NEWLINK` netlink request, and checks the kernel's answer.
fn loopback_up() -> io::Result<()> {
    use rustix::net::{recv, send, socket_with};
    const RTM_NEWLINK: u16 = 16;
    const NLM_F_REQUEST_ACK: u16 = 0x1 | 0x4;
    const NLMSG_ERROR: u16 = 2;
    const IFF_UP: u32 = 1;
    let socket = socket_with(
        AddressFamily::NETLINK,
        SocketType::RAW,
        SocketFlags::CLOEXEC,
        None, // NETLINK_ROUTE
    )?;
    let mut msg = Vec::with_capacity(32);
    msg.extend_from_slice(&32u32.to_ne_bytes()); // nlmsg_len
    msg.extend_from_slice(&RTM_NEWLINK.to_ne_bytes());
    msg.extend_from_slice(&NLM_F_REQUEST_ACK.to_ne_bytes());
    msg.extend_from_slice(&1u32.to_ne_bytes()); // seq
    msg.extend_from_slice(&0u32.to_ne_bytes()); // pid: the kernel
    msg.extend_from_slice(&[0, 0]); // ifi_family AF_UNSPEC, padding
    msg.extend_from_slice(&0u16.to_ne_bytes()); // ifi_type
    msg.extend_from_slice(&1i32.to_ne_bytes()); // ifi_index: lo
    msg.extend_from_slice(&IFF_UP.to_ne_bytes()); // ifi_flags
    msg.extend_from_slice(&IFF_UP.to_ne_bytes()); // ifi_change
    send(&socket, &msg, SendFlags::empty())?;
    let mut answer = [0u8; 512];
    let (n, _) = recv(&socket, &mut answer, RecvFlags::empty())?;
    let kind = answer.get(4..6).map(|b| u16::from_ne_bytes([b[0], b[1]]));
    let error = answer
        .get(16..20)
        .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
    match (n >= 20, kind, error) {
        (true, Some(NLMSG_ERROR), Some(0)) => Ok(()),
        (true, Some(NLMSG_ERROR), Some(errno)) => Err(io::Error::from_raw_os_error(-errno)),
        _ => Err(io::Error::other("unexpected netlink answer bringing lo up")),
    }
}

/// Sends `fd` over the Unix socket `socket` (`SCM_RIGHTS`, one byte of data).
fn send_fd(socket: impl AsFd, fd: impl AsFd) -> io::Result<()> {
    let fds = [fd.as_fd()];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    control.push(SendAncillaryMessage::ScmRights(&fds));
    rustix::net::sendmsg(
        socket,
        &[io::IoSlice::new(b"l")],
        &mut control,
        SendFlags::empty(),
    )?;
    Ok(())
}

/// The `child-pid` bwrap writes on its info fd.
fn child_pid(info: &mut File) -> io::Result<i32> {
    let mut text = String::new();
    let mut buf = [0u8; 256];
    loop {
        let n = info.read(&mut buf)?;
        if n == 0 {
            break;
        }
        text.push_str(&String::from_utf8_lossy(&buf[..n]));
        if text.contains('}') {
            break;
        }
    }
    let value: serde_json::Value = serde_json::from_str(text.trim())
        .map_err(|_| io::Error::other("bwrap did not start the sandbox (see its message)"))?;
    value["child-pid"]
        .as_i64()
        .and_then(|p| i32::try_from(p).ok())
        .ok_or_else(|| io::Error::other(format!("bwrap's info has no child-pid: {text}")))
}

fn receive_fd(socket: &OwnedFd) -> io::Result<OwnedFd> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut byte = [0u8; 1];
    rustix::net::recvmsg(
        socket,
        &mut [io::IoSliceMut::new(&mut byte)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(mut fds) = message
            && let Some(fd) = fds.next()
        {
            return Ok(fd);
        }
    }
    Err(io::Error::other("the helper sent no listener"))
}

/// Runs the helper when `args` asks for it; `None` otherwise. kiln's `main` calls this before
/// any thread exists (joining a user namespace needs a single-threaded process).
pub fn dispatch(args: &[OsString]) -> Option<ExitCode> {
    if args.get(1)? != HELPER {
        return None;
    }
    match helper(&args[2..]) {
        Ok(()) => Some(ExitCode::SUCCESS),
        Err(e) => {
            eprintln!("{e}");
            Some(ExitCode::FAILURE)
        }
    }
}

/// `PID PORT`: joins the user and network namespaces of PID, listens on 127.0.0.1:PORT and
/// sends the socket over stdout (a Unix socket).
fn helper(args: &[OsString]) -> io::Result<()> {
    let usage = || io::Error::other("usage: PID PORT");
    let arg = |i: usize| args.get(i).and_then(|a| a.to_str()).ok_or_else(usage);
    let (pid, port) = (arg(0)?, arg(1)?);
    let port: u16 = port.parse().map_err(|_| usage())?;
    let stdout = io::stdout();
    let socket = stdout.as_fd();
    // Both are opened first: once in the sandbox's user namespace, its /proc is not ours.
    let user = File::open(format!("/proc/{pid}/ns/user"))?;
    let net = File::open(format!("/proc/{pid}/ns/net"))?;
    use rustix::thread::{LinkNameSpaceType, move_into_link_name_space};
    move_into_link_name_space(user.as_fd(), Some(LinkNameSpaceType::User))
        .map_err(|e| io::Error::other(format!("joining the sandbox's user namespace: {e}")))?;
    move_into_link_name_space(net.as_fd(), Some(LinkNameSpaceType::Network))
        .map_err(|e| io::Error::other(format!("joining the sandbox's network: {e}")))?;
    let listener = bind_once_loopback_is_up(port)?;
    send_fd(socket, listener.as_fd())
}

/// How long the helper waits for the sandbox's loopback: bwrap reports the sandbox's pid
/// right after creating it, and brings `lo` up a few system calls later.
const LOOPBACK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Binds `127.0.0.1:port`, waiting (up to [`LOOPBACK_WAIT`]) while the address does not
/// exist yet: until `lo` is up, binding fails with `EADDRNOTAVAIL`.
fn bind_once_loopback_is_up(port: u16) -> io::Result<std::net::TcpListener> {
    let deadline = std::time::Instant::now() + LOOPBACK_WAIT;
    loop {
        match std::net::TcpListener::bind(("127.0.0.1", port)) {
            Err(e) if e.kind() == io::ErrorKind::AddrNotAvailable => {
                if std::time::Instant::now() > deadline {
                    return Err(io::Error::other(format!(
                        "the sandbox's loopback did not come up within {}s: {e}",
                        LOOPBACK_WAIT.as_secs()
                    )));
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            bound => return bound,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::Bind;

    /// A bwrap sandbox of the host's root whose program leaves a mark in `out` when it runs.
    fn marking_sandbox(out: &std::path::Path) -> (tokio::process::Command, Gate) {
        let sandbox = Sandbox {
            binds: vec![Bind::writable(out, "/tmp/out")],
            ..Sandbox::new("/")
        };
        let argv = ["/bin/sh", "-c", "echo ran > /tmp/out/mark"].map(String::from);
        command(&sandbox, &argv, 3128).expect("gate command")
    }

    #[tokio::test]
    async fn a_gate_that_cannot_place_its_listener_never_lets_the_program_run() {
        let out = tempfile::tempdir().expect("tempdir");
        let (mut cmd, gate) = marking_sandbox(out.path());
        let mut child = cmd.spawn().expect("bwrap runs");
        let refuse = |_: i32, _: u16| Err(io::Error::other("refused for the test"));
        let err = gate.open_with(&mut child, refuse).await.unwrap_err();
        assert_eq!(err.to_string(), "refused for the test");
        let status = child.wait().await.expect("bwrap exits");
        assert!(!status.success(), "the sandbox was killed: {status}");
        // Whatever was left in the sandbox would have run by now.
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        assert!(!out.path().join("mark").exists(), "the program ran");
    }

    #[tokio::test]
    async fn a_placed_listener_lets_the_program_run() {
        let out = tempfile::tempdir().expect("tempdir");
        let (mut cmd, gate) = marking_sandbox(out.path());
        let mut child = cmd.spawn().expect("bwrap runs");
        // Any listener will do: this process cannot join the sandbox (it has threads).
        let place = |_: i32, _: u16| {
            let listener = std::net::TcpListener::bind(("127.0.0.1", 0))?;
            Ok(OwnedFd::from(listener))
        };
        gate.open_with(&mut child, place).await.expect("gate opens");
        let status = child.wait().await.expect("bwrap exits");
        assert!(status.success(), "{status}");
        assert!(out.path().join("mark").exists(), "the program did not run");
    }
}
