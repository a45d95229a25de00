//! kiln's own sandbox, for machines without bubblewrap: util-linux `unshare` creates the
//! namespaces (it is on every Debian system) and a hidden subcommand of the kiln binary, pid 1
//! inside them, builds the root filesystem the way bwrap would, drops every capability and
//! runs the program. No unsafe code: the namespace and uid-mapping work that needs `fork`
//! happens in `unshare`; here only mounts, `pivot_root` and capability calls remain.
//!
//! The process tree mirrors bwrap's, which [`super::forward_signal`] relies on: the launcher
//! (`unshare`, the process kiln spawns) has one child, the init process, which called
//! `setsid()` so its host pid is the sandbox's process group.

use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use rustix::fs::StatVfsMountFlags;
use rustix::mount::{MountFlags, MountPropagationFlags, UnmountFlags};
use rustix::process::WaitOptions;
use rustix::thread::{CapabilitySet, CapabilitySets};

use super::{Error, Result, Sandbox};
use crate::rootpath::{self, Last};

/// The hidden subcommand that runs as the sandbox's init process.
pub const INIT: &str = "__sandbox-init";

/// util-linux's namespace tool.
const UNSHARE: &str = "unshare";
/// util-linux's tool that, among other things, sets the parent-death signal before an exec.
const SETPRIV: &str = "setpriv";
/// The exit code when the program cannot be started (as a shell's "command not found").
const CANNOT_RUN: u8 = 127;

/// Where the built-in sandbox's parts are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Builtin {
    /// util-linux `unshare`.
    pub unshare: PathBuf,
    /// util-linux `setpriv`, when installed: makes the sandbox die with kiln.
    pub setpriv: Option<PathBuf>,
    /// The kiln executable, whose hidden [`INIT`] subcommand sets up the root.
    pub exe: PathBuf,
}

impl Builtin {
    /// Finds `unshare` (and `setpriv`) on `path` (a `PATH` value) and kiln's own executable.
    ///
    /// # Errors
    /// [`Error::Missing`] without `unshare`, [`Error::Spawn`] when the running executable
    /// cannot be found.
    pub fn find(path: &str) -> Result<Builtin> {
        let unshare = which(path, UNSHARE).ok_or_else(|| Error::Missing {
            program: format!("{} or {UNSHARE}", super::BWRAP),
        })?;
        let exe = std::env::current_exe().map_err(|source| Error::Spawn {
            program: "kiln (its own executable)".into(),
            source,
        })?;
        Ok(Builtin {
            unshare,
            setpriv: which(path, SETPRIV),
            exe,
        })
    }

    /// The program and arguments that run `argv` in `sandbox`: `setpriv` (when there) and
    /// `unshare` make the namespaces, with the caller's uid and gid mapped to the sandbox's
    /// and the capabilities kept for the init process, which drops them before the program.
    pub fn argv(&self, sandbox: &Sandbox, argv: &[String]) -> Vec<OsString> {
        let mut args: Vec<OsString> = Vec::new();
        if let Some(setpriv) = &self.setpriv {
            args.extend([
                setpriv.into(),
                "--pdeathsig".into(),
                "KILL".into(),
                "--".into(),
            ]);
        }
        args.push(self.unshare.clone().into());
        args.extend(
            [
                format!("--map-user={}", sandbox.uid),
                format!("--map-group={}", sandbox.gid),
            ]
            .map(OsString::from),
        );
        let flags = [
            "--keep-caps",
            "--mount",
            "--pid",
            "--ipc",
            "--uts",
            "--fork",
        ];
        args.extend(flags.map(OsString::from));
        if !sandbox.share_network {
            args.push("--net".into());
        }
        args.extend(["--kill-child", "--"].map(OsString::from));
        // A path that is not UTF-8 cannot be described; init then says the description is bad.
        let spec = serde_json::to_string(sandbox).unwrap_or_default();
        args.extend([
            self.exe.clone().into(),
            INIT.into(),
            spec.into(),
            "--".into(),
        ]);
        args.extend(argv.iter().map(OsString::from));
        args
    }

    /// Checks that user namespaces can be created, by running `unshare` as the sandbox would
    /// (uid 1000 mapped, capabilities kept) around `true`.
    ///
    /// # Errors
    /// [`Error::NoUserNamespaces`] with `unshare`'s message, [`Error::Spawn`].
    pub async fn probe(&self) -> Result<()> {
        let mut cmd = tokio::process::Command::new(&self.unshare);
        cmd.args(["--map-user=1000", "--map-group=1000", "--keep-caps"])
            .args(["--mount", "--pid", "--fork", "--", "true"]);
        super::run_probe(UNSHARE, &mut cmd).await
    }
}

/// The first `name` in the directories of `path`.
fn which(path: &str, name: &str) -> Option<PathBuf> {
    path.split(':')
        .filter(|dir| !dir.is_empty())
        .map(|dir| Path::new(dir).join(name))
        .find(|candidate| candidate.is_file())
}

/// Runs the init process when `args` (the whole command line) asks for it; `None` otherwise.
/// kiln's `main` calls this first, before any thread exists.
pub fn dispatch(args: &[OsString]) -> Option<ExitCode> {
    if args.get(1)? != INIT {
        return None;
    }
    let code = match init(&args[2..]) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("kiln sandbox: {e}");
            1
        }
    };
    Some(ExitCode::from(code))
}

/// A failed setup step.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
struct Failure {
    what: String,
    source: io::Error,
}

/// Wraps an error with what was being done.
fn step<E: Into<io::Error>>(what: impl FnOnce() -> String) -> impl FnOnce(E) -> Failure {
    move |e| Failure {
        what: what(),
        source: e.into(),
    }
}

/// `SPEC -- ARGV…`: sets the root up, starts the program, reaps until it exits and returns
/// its exit code (128 + the signal when a signal killed it).
fn init(args: &[OsString]) -> Result<u8, Failure> {
    let (spec, argv) = parse(args)?;
    rustix::process::setsid().map_err(step(|| "starting a new session".into()))?;
    if let Some(door) = &spec.gate {
        super::gate::send_from_init(door).map_err(step(|| {
            "giving kiln a listener on the sandbox's loopback".into()
        }))?;
    }
    build_root(&spec)?;
    if let Some(name) = &spec.hostname {
        rustix::system::sethostname(name.as_bytes())
            .map_err(step(|| format!("setting the host name {name}")))?;
    }
    drop_privileges()?;
    let child = match std::process::Command::new(&argv[0])
        .args(&argv[1..])
        .spawn()
    {
        Ok(child) => child,
        Err(e) => {
            eprintln!("kiln sandbox: cannot run {}: {e}", argv[0]);
            return Ok(CANNOT_RUN);
        }
    };
    reap(child.id())
}

fn parse(args: &[OsString]) -> Result<(Sandbox, Vec<String>), Failure> {
    let invalid = |what: &str| Failure {
        what: format!("invalid arguments for {INIT}"),
        source: io::Error::new(io::ErrorKind::InvalidInput, what.to_string()),
    };
    let [spec, dashes, argv @ ..] = args else {
        return Err(invalid("expected SPEC -- PROGRAM [ARGS…]"));
    };
    if dashes != "--" || argv.is_empty() {
        return Err(invalid("expected SPEC -- PROGRAM [ARGS…]"));
    }
    let spec: Sandbox = serde_json::from_str(spec.to_str().unwrap_or_default())
        .map_err(step(|| "reading the sandbox description".into()))?;
    let argv = argv
        .iter()
        .map(|a| a.to_str().map(str::to_string))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| invalid("the command line is not UTF-8"))?;
    Ok((spec, argv))
}

/// Mounts everything under `spec.rootfs` (itself bound to a mount point), then makes it `/`.
fn build_root(spec: &Sandbox) -> Result<(), Failure> {
    let root = spec.rootfs.as_path();
    let propagation = MountPropagationFlags::REC | MountPropagationFlags::PRIVATE;
    rustix::mount::mount_change("/", propagation)
        .map_err(step(|| "making the mounts private".into()))?;
    rustix::mount::mount_bind_recursive(root, root)
        .map_err(step(|| format!("binding {}", root.display())))?;
    let proc_dir = mount_point(root, "/proc", Kind::Dir)?;
    let flags = MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC;
    // A fresh proc needs a fully visible host /proc; container runtimes mask parts of it
    // (Docker's default). Binding the outer /proc instead would show every outer process and
    // its command line inside, so that is an error, as it is for bwrap.
    rustix::mount::mount("proc", &proc_dir, "proc", flags, None).map_err(step(|| {
        "mounting a new /proc (the outer /proc is probably masked by a container runtime: run \
         the container with an unmasked /proc — docker run --security-opt \
         systempaths=unconfined, or procMount: Unmasked in a Pod; kiln does not fall back to \
         showing the outer processes)"
            .into()
    }))?;
    mount_dev(root)?;
    for dir in &spec.tmpfs {
        let target = mount_point(root, dir, Kind::Dir)?;
        tmpfs(
            &target,
            c"mode=0755",
            MountFlags::NOSUID | MountFlags::NODEV,
        )?;
    }
    for bind in &spec.binds {
        let meta = match fs::metadata(&bind.source) {
            Ok(meta) => meta,
            Err(e) if bind.optional && rootpath::is_missing(&e) => continue,
            Err(e) => return Err(step(|| format!("binding {}", bind.source.display()))(e)),
        };
        let kind = if meta.is_dir() { Kind::Dir } else { Kind::File };
        let target = mount_point(root, &bind.dest, kind)?;
        rustix::mount::mount_bind_recursive(&bind.source, &target).map_err(step(|| {
            format!("binding {} at {}", bind.source.display(), bind.dest)
        }))?;
        if !bind.writable {
            remount_read_only(&target)?;
        }
    }
    if spec.read_only_root {
        remount_read_only(root)?;
    }
    // pivot_root(".", ".") stacks the old root on the new one; detaching it leaves the new.
    std::env::set_current_dir(root).map_err(step(|| format!("entering {}", root.display())))?;
    rustix::process::pivot_root(".", ".").map_err(step(|| "pivot_root".into()))?;
    rustix::mount::unmount(".", UnmountFlags::DETACH)
        .map_err(step(|| "detaching the host's root".into()))?;
    std::env::set_current_dir("/").map_err(step(|| "entering /".into()))?;
    std::env::set_current_dir(&spec.cwd).map_err(step(|| {
        format!("entering the working directory {}", spec.cwd)
    }))
}

/// A minimal `/dev` as bwrap makes it: a tmpfs with the host's harmless character devices
/// bound in, the usual links, a private `/dev/shm` and, when allowed, a private devpts.
fn mount_dev(root: &Path) -> Result<(), Failure> {
    let dev = mount_point(root, "/dev", Kind::Dir)?;
    tmpfs(&dev, c"mode=0755", MountFlags::NOSUID | MountFlags::NOEXEC)?;
    for name in ["null", "zero", "full", "random", "urandom", "tty"] {
        let host = Path::new("/dev").join(name);
        if !host.exists() {
            continue;
        }
        let target = mount_point(&dev, name, Kind::File)?;
        rustix::mount::mount_bind(&host, &target)
            .map_err(step(|| format!("binding {}", host.display())))?;
    }
    let links = [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
        ("ptmx", "pts/ptmx"),
    ];
    for (name, target) in links {
        symlink(target, dev.join(name)).map_err(step(|| format!("linking /dev/{name}")))?;
    }
    let shm = mount_point(&dev, "shm", Kind::Dir)?;
    tmpfs(&shm, c"mode=1777", MountFlags::NOSUID | MountFlags::NODEV)?;
    let pts = mount_point(&dev, "pts", Kind::Dir)?;
    // Only terminals need it, and some kernels refuse it in a user namespace.
    let _ = rustix::mount::mount(
        "devpts",
        &pts,
        "devpts",
        MountFlags::NOSUID | MountFlags::NOEXEC,
        c"newinstance,ptmxmode=0666,mode=620",
    );
    Ok(())
}

fn tmpfs(target: &Path, data: &std::ffi::CStr, flags: MountFlags) -> Result<(), Failure> {
    rustix::mount::mount("tmpfs", target, "tmpfs", flags, data)
        .map_err(step(|| format!("mounting a tmpfs at {}", target.display())))
}

/// What a mount point is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Dir,
    File,
}

/// The host path of `dest` inside `root`, with symlinks resolved inside the root (so an
/// image's links cannot point a mount elsewhere), created when missing.
fn mount_point(root: &Path, dest: &str, kind: Kind) -> Result<PathBuf, Failure> {
    let what = || format!("making the mount point {dest}");
    let path = rootpath::resolve(root, Path::new(dest), Last::Follow)
        .map_err(|e| step(what)(io::Error::other(e)))?;
    match kind {
        Kind::Dir => fs::create_dir_all(&path).map_err(step(what))?,
        Kind::File => {
            if let Some(parent) = path.parent() {
                fs::create_dir_all(parent).map_err(step(what))?;
            }
            if !path.exists() {
                fs::File::create(&path).map_err(step(what))?;
            }
        }
    }
    Ok(path)
}

/// Remounts the bind mount at `target` read-only. The flags the kernel locked on it
/// (nosuid, nodev, noexec, atime) must be repeated or a user namespace's remount is refused.
fn remount_read_only(target: &Path) -> Result<(), Failure> {
    let what = || format!("making {} read-only", target.display());
    let current = rustix::fs::statvfs(target).map_err(step(what))?.f_flag;
    let mut flags = MountFlags::BIND | MountFlags::RDONLY;
    let kept = [
        (StatVfsMountFlags::NOSUID, MountFlags::NOSUID),
        (StatVfsMountFlags::NODEV, MountFlags::NODEV),
        (StatVfsMountFlags::NOEXEC, MountFlags::NOEXEC),
        (StatVfsMountFlags::NOATIME, MountFlags::NOATIME),
        (StatVfsMountFlags::NODIRATIME, MountFlags::NODIRATIME),
        (StatVfsMountFlags::RELATIME, MountFlags::RELATIME),
    ];
    for (statvfs, mount) in kept {
        if current.contains(statvfs) {
            flags |= mount;
        }
    }
    rustix::mount::mount_remount(target, flags, "").map_err(step(what))
}

/// Drops every capability for good: out of the bounding set (so an exec cannot regain them,
/// even as uid 0), the ambient and inheritable sets `unshare --keep-caps` filled, and the
/// permitted and effective sets; then `no_new_privs`.
fn drop_privileges() -> Result<(), Failure> {
    for cap in CapabilitySet::all().iter() {
        // Capabilities this kernel does not know give EINVAL; they cannot be held anyway.
        let _ = rustix::thread::remove_capability_from_bounding_set(cap);
    }
    let what = || "dropping capabilities".to_string();
    rustix::thread::clear_ambient_capability_set().map_err(step(what))?;
    let none = CapabilitySets {
        effective: CapabilitySet::empty(),
        permitted: CapabilitySet::empty(),
        inheritable: CapabilitySet::empty(),
    };
    rustix::thread::set_capabilities(None, none).map_err(step(what))?;
    rustix::thread::set_no_new_privs(true).map_err(step(|| "setting no_new_privs".into()))
}

/// Waits for every child (pid 1 inherits orphans) until `program` exits; its exit code.
fn reap(program: u32) -> Result<u8, Failure> {
    loop {
        let waited = rustix::process::wait(WaitOptions::empty());
        match waited {
            Ok(Some((pid, status))) if pid.as_raw_nonzero().get() as u32 == program => {
                return Ok(match (status.exit_status(), status.terminating_signal()) {
                    (Some(code), _) => u8::try_from(code).unwrap_or(1),
                    (None, Some(signal)) => u8::try_from(128 + signal).unwrap_or(255),
                    (None, None) => 1,
                });
            }
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(step(|| "waiting for the program".into())(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::Bind;

    fn builtin() -> Builtin {
        Builtin {
            unshare: "/usr/bin/unshare".into(),
            setpriv: Some("/usr/bin/setpriv".into()),
            exe: "/opt/kiln".into(),
        }
    }

    #[test]
    fn the_command_line_maps_the_user_and_hands_the_description_to_init() {
        let sandbox = Sandbox {
            uid: 1000,
            gid: 100,
            share_network: true,
            env: vec![("TOKEN".into(), "s3cret".into())],
            binds: vec![Bind::read_only("/etc/resolv.conf", "/etc/resolv.conf")],
            ..Sandbox::new("/cache/rootfs")
        };
        let args: Vec<String> = builtin()
            .argv(&sandbox, &["node".into(), "server.js".into()])
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect();
        let joined = args.join(" ");
        assert!(joined.starts_with(
            "/usr/bin/setpriv --pdeathsig KILL -- /usr/bin/unshare --map-user=1000 \
             --map-group=100 --keep-caps --mount --pid --ipc --uts --fork --kill-child -- \
             /opt/kiln __sandbox-init "
        ));
        assert!(joined.ends_with(" -- node server.js"), "{joined}");
        assert!(!args.contains(&"--net".to_string()));
        let spec = &args[args.iter().position(|a| a == INIT).unwrap() + 1];
        let (parsed, argv) = parse(&[spec.into(), "--".into(), "node".into()]).unwrap();
        assert_eq!(parsed.binds, sandbox.binds);
        assert_eq!(argv, ["node"]);
        // The environment goes to the process, never onto a command line.
        assert!(!spec.contains("s3cret"), "{spec}");
        assert!(parsed.env.is_empty());
    }

    #[test]
    fn without_network_sharing_the_sandbox_gets_its_own_network_namespace() {
        let args = builtin().argv(&Sandbox::new("/r"), &["true".into()]);
        assert!(args.contains(&OsString::from("--net")));
    }

    #[test]
    fn init_refuses_malformed_arguments_with_a_reason() {
        let e = parse(&["{}".into(), "node".into()]).unwrap_err();
        assert!(e.to_string().contains("expected SPEC -- PROGRAM"), "{e}");
        let e = parse(&["not json".into(), "--".into(), "x".into()]).unwrap_err();
        assert!(e.to_string().contains("sandbox description"), "{e}");
    }

    #[test]
    fn which_finds_programs_on_a_path_value() {
        assert!(which("/nonexistent:/usr/bin:/bin", "unshare").is_some());
        assert_eq!(which("/nonexistent", "unshare"), None);
    }
}
