//! User-mode emulation for a sandbox whose programs are built for another CPU: QEMU's static
//! user-mode emulator (Debian's `qemu-user-static`).
//!
//! - The sandbox's first program runs under the emulator directly, with the foreign program
//!   as its argument ([`Emulator::wrap`]).
//! - The programs it starts (the shell of an install script, a compiler, `pip`'s build
//!   backend) need the kernel to know the emulator: binfmt_misc. The host's is global and
//!   needs root, so kiln does not touch it. Since Linux 6.7 a user namespace can have a
//!   binfmt_misc of its own, which its descendants inherit: [`Emulator::enter`] puts the
//!   sandbox in a user and mount namespace whose binfmt_misc runs the foreign CPU's
//!   programs under the emulator (registered with the `F` flag: the kernel holds the
//!   emulator file open, so nothing inside the sandbox needs to see it). Nothing in the
//!   sandbox can reach that binfmt_misc: it is mounted on the outer namespace's
//!   `/proc/sys/fs/binfmt_misc`, and the sandbox has a `/proc` of its own.
//! - Where the kernel cannot do that ([`Emulator::children`] says), only the first program
//!   is emulated, and a process it starts fails to run.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Mutex;

use super::{Bind, Sandbox};
use crate::rootpath::Last;

/// Where the emulator appears in the sandbox.
const INSIDE: &str = "/usr/libexec/kiln";

/// The hidden subcommand that registers the emulator in a fresh user namespace's binfmt_misc
/// and then runs the sandbox ([`dispatch`]).
pub const HELPER: &str = "__binfmt";

/// Where the helper mounts the namespace's own binfmt_misc.
const BINFMT_MISC: &str = "/proc/sys/fs/binfmt_misc";

/// binfmt_misc's magic and mask for the ELF executables of a CPU (the `e_ident` class, data
/// and version bytes and the `e_type` and `e_machine` fields), as QEMU's own
/// `qemu-binfmt-conf.sh` and Debian's qemu-user-binfmt register them; `\x` escapes, which
/// the kernel decodes.
fn elf_magic(machine: &str) -> Option<(&'static str, &'static str)> {
    Some(match machine {
        "aarch64" => (
            r"\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00",
            r"\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff",
        ),
        "x86_64" => (
            r"\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\x3e\x00",
            r"\xff\xff\xff\xff\xff\xfe\xfe\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff",
        ),
        _ => return None,
    })
}

/// Lets a foreign program run in a sandbox.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Emulator {
    /// The static emulator on the host (`/usr/bin/qemu-aarch64-static`).
    pub path: PathBuf,
    /// Its file name, which it also has in the sandbox.
    name: String,
    /// The kernel's name for the CPU it emulates (`aarch64`).
    machine: String,
}

/// Why a foreign platform's program cannot run here.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No emulator for this CPU on `PATH`.
    #[error(
        "{platform} programs cannot run on this {host} machine without an emulator, and {program} \
         is not on PATH: install Debian's qemu-user-static (apt-get install qemu-user-static)"
    )]
    Missing {
        /// The platform asked for.
        platform: String,
        /// This machine's.
        host: String,
        /// The emulator looked for.
        program: String,
    },
    /// A platform kiln knows no emulator name for.
    #[error("kiln cannot run {platform} programs on this {host} machine: no emulator is known")]
    Unknown {
        /// The platform asked for.
        platform: String,
        /// This machine's.
        host: String,
    },
}

impl Emulator {
    /// The emulator a program for `platform` (shown in messages) needs here: `None` on a
    /// machine whose CPU is `machine` (the kernel's name: `x86_64`, `aarch64`; `None` for a
    /// CPU kiln has no name for), else `qemu-MACHINE-static` from `PATH`.
    ///
    /// # Errors
    /// A foreign CPU without an emulator on `PATH`, or one kiln knows no emulator for.
    pub fn for_machine(machine: Option<&str>, platform: &str) -> Result<Option<Emulator>, Error> {
        let host = format!("linux/{}", std::env::consts::ARCH);
        let Some(machine) = machine else {
            return Err(Error::Unknown {
                platform: platform.into(),
                host,
            });
        };
        if machine == std::env::consts::ARCH {
            return Ok(None);
        }
        let name = format!("qemu-{machine}-static");
        let found = std::env::var_os("PATH").and_then(|path| {
            std::env::split_paths(&path)
                .map(|dir| dir.join(&name))
                .find(|p| is_executable(p))
        });
        match found {
            Some(path) => Ok(Some(Emulator {
                path,
                name,
                machine: machine.into(),
            })),
            None => Err(Error::Missing {
                platform: platform.into(),
                host,
                program: name,
            }),
        }
    }

    /// Makes `sandbox` run `argv` under the emulator and returns the command line to run:
    /// every program the sandbox starts, `argv` first, where [`Emulator::children`] allows
    /// (then `argv` is unchanged: the kernel runs it as it runs a script's interpreter);
    /// else `argv`'s program alone ([`Emulator::wrap`]), with a warning.
    pub fn apply(&self, sandbox: &mut Sandbox, argv: &[String]) -> Vec<String> {
        match self.children() {
            Ok(()) => {
                sandbox.emulator = Some(self.clone());
                argv.to_vec()
            }
            Err(why) => {
                tracing::warn!(
                    why,
                    "only the first program runs under emulation: a program it starts will \
                     not run",
                );
                self.wrap(sandbox, argv)
            }
        }
    }

    /// Binds the emulator into `sandbox` (read-only) and returns the command line that runs
    /// `argv` under it. The emulator does not search `PATH`: a program named without a `/`
    /// is looked up in the sandbox's `PATH` here, as the kernel's exec would have.
    pub fn wrap(&self, sandbox: &mut Sandbox, argv: &[String]) -> Vec<String> {
        let inside = format!("{INSIDE}/{}", self.name);
        sandbox
            .binds
            .push(Bind::read_only(self.path.clone(), inside.clone()));
        let mut argv = argv.to_vec();
        if let Some(program) = argv.first_mut()
            && !program.contains('/')
            && let Some(found) = lookup(sandbox, program)
        {
            *program = found;
        }
        std::iter::once(inside).chain(argv).collect()
    }

    /// The binfmt_misc registration that runs this CPU's executables under the emulator,
    /// held open (`F`); `None` for a CPU without known ELF magic, or an emulator path that
    /// the registration's syntax cannot carry.
    fn entry(&self) -> Option<String> {
        let (magic, mask) = elf_magic(&self.machine)?;
        let path = self.path.to_str().filter(|p| !p.contains([':', '\n']))?;
        Some(format!(":kiln-{}:M::{magic}:{mask}:{path}:F", self.machine))
    }

    /// Whether the programs an emulated program starts are emulated too: whether this
    /// kernel lets kiln register the emulator in a user namespace of its own (Linux 6.7 or
    /// later, with binfmt_misc; util-linux `unshare` makes the namespace). Tried once per
    /// emulator; the reason when not.
    ///
    /// # Errors
    /// Why the registration failed, as a sentence.
    pub fn children(&self) -> Result<(), String> {
        self.outer().map(|_| ())
    }

    /// `line` (a sandbox's whole command line, bwrap's or the built-in sandbox's) run in a
    /// user and mount namespace whose binfmt_misc emulates this CPU, so every program the
    /// sandbox starts is emulated. Unchanged where [`Emulator::children`] fails.
    pub fn enter(&self, line: Vec<OsString>) -> Vec<OsString> {
        let (Ok(outer), Some(entry)) = (self.outer(), self.entry()) else {
            return line;
        };
        let mut entered: Vec<OsString> = vec![
            outer.unshare.into(),
            "--user".into(),
            "--map-root-user".into(),
            "--mount".into(),
            "--".into(),
            outer.exe.into(),
            HELPER.into(),
            entry.into(),
            "--".into(),
        ];
        entered.extend(line);
        entered
    }

    /// The programs [`Emulator::enter`] runs, once the registration has been tried.
    fn outer(&self) -> Result<Outer, String> {
        static TRIED: Mutex<Vec<(Emulator, Result<Outer, String>)>> = Mutex::new(Vec::new());
        let mut tried = TRIED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((_, known)) = tried.iter().find(|(e, _)| e == self) {
            return known.clone();
        }
        let outcome = self.try_outer();
        if let Err(why) = &outcome {
            tracing::debug!(
                emulator = %self.path.display(),
                why,
                "no emulation of child processes"
            );
        }
        tried.push((self.clone(), outcome.clone()));
        outcome
    }

    fn try_outer(&self) -> Result<Outer, String> {
        let entry = self.entry().ok_or_else(|| {
            format!(
                "kiln cannot register {} with binfmt_misc",
                self.path.display()
            )
        })?;
        let path = std::env::var("PATH").unwrap_or_default();
        let unshare = std::env::split_paths(&path)
            .map(|dir| dir.join("unshare"))
            .find(|p| is_executable(p))
            .ok_or("util-linux unshare is not on PATH")?;
        let exe = std::env::current_exe().map_err(|e| format!("finding kiln itself: {e}"))?;
        let output = std::process::Command::new(&unshare)
            .args(["--user", "--map-root-user", "--mount", "--"])
            .arg(&exe)
            .args([HELPER, &entry])
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| format!("running {}: {e}", unshare.display()))?;
        if !output.status.success() {
            return Err(format!(
                "this kernel does not let a user namespace register an emulator with \
                 binfmt_misc (Linux 6.7 or later can): {}",
                String::from_utf8_lossy(&output.stderr).trim()
            ));
        }
        Ok(Outer { unshare, exe })
    }
}

/// What puts a sandbox into a namespace that emulates: util-linux `unshare` and kiln itself.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Outer {
    unshare: PathBuf,
    exe: PathBuf,
}

/// Runs the helper when `args` (the whole command line) asks for it; `None` otherwise.
/// `kiln __binfmt ENTRY [-- PROGRAM ARGS…]`, run by `unshare` as root of a fresh user and
/// mount namespace: mounts the namespace's binfmt_misc, registers `ENTRY`, and becomes the
/// program (without one, it only checks that the registration works).
pub fn dispatch(args: &[OsString]) -> Option<ExitCode> {
    if args.get(1)? != HELPER {
        return None;
    }
    let Err(e) = register_and_exec(&args[2..]) else {
        return Some(ExitCode::SUCCESS);
    };
    eprintln!("kiln: emulating another CPU in a sandbox: {e}");
    Some(ExitCode::from(125))
}

/// See [`dispatch`]: returns only to check, or on failure.
fn register_and_exec(args: &[OsString]) -> std::io::Result<()> {
    use rustix::mount::MountFlags;
    use std::os::unix::process::CommandExt as _;
    let invalid =
        |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidInput, what.to_string());
    let entry = args
        .first()
        .ok_or_else(|| invalid("no registration given"))?;
    let flags = MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC;
    rustix::mount::mount("binfmt_misc", BINFMT_MISC, "binfmt_misc", flags, None).map_err(|e| {
        std::io::Error::other(format!("mounting binfmt_misc on {BINFMT_MISC}: {e}"))
    })?;
    std::fs::write(format!("{BINFMT_MISC}/register"), entry.as_encoded_bytes())
        .map_err(|e| std::io::Error::other(format!("registering the emulator: {e}")))?;
    match args.get(1..) {
        None | Some([]) => Ok(()),
        Some([dash, program, rest @ ..]) if dash == "--" => {
            Err(std::process::Command::new(program).args(rest).exec())
        }
        Some(_) => Err(invalid("expected -- PROGRAM ARGS after the registration")),
    }
}

/// `program` in the directories of the sandbox's `PATH`, inside its root filesystem.
fn lookup(sandbox: &Sandbox, program: &str) -> Option<String> {
    let path = sandbox.env.iter().find(|(k, _)| k == "PATH")?;
    path.1
        .split(':')
        .filter(|dir| dir.starts_with('/'))
        .map(|dir| format!("{}/{program}", dir.trim_end_matches('/')))
        .find(|inside| {
            crate::rootpath::resolve(&sandbox.rootfs, Path::new(inside), Last::Follow)
                .is_ok_and(|host| is_executable(&host))
        })
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn the_host_platform_needs_no_emulator_and_an_unknown_one_is_refused() {
        let host = std::env::consts::ARCH;
        assert_eq!(
            Emulator::for_machine(Some(host), "linux/host").unwrap(),
            None
        );
        let err = Emulator::for_machine(None, "linux/riscv64").unwrap_err();
        assert!(err.to_string().contains("no emulator is known"), "{err}");
    }

    #[test]
    fn the_wrapped_command_runs_the_program_under_the_bound_emulator() {
        let emulator = Emulator {
            path: "/usr/bin/qemu-aarch64-static".into(),
            name: "qemu-aarch64-static".into(),
            machine: "aarch64".into(),
        };
        let mut sandbox = Sandbox::new("/root");
        let argv = emulator.wrap(&mut sandbox, &["/usr/bin/node".into(), "s.js".into()]);
        assert_eq!(
            argv,
            [
                "/usr/libexec/kiln/qemu-aarch64-static",
                "/usr/bin/node",
                "s.js"
            ]
        );
        // A bare name is found in the sandbox's PATH, inside its root.
        let root = tempfile::tempdir().unwrap();
        let bin = root.path().join("usr/local/bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::write(bin.join("node"), b"").unwrap();
        std::fs::set_permissions(bin.join("node"), std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut rooted = Sandbox::new(root.path());
        rooted.env = vec![("PATH".into(), "/usr/bin:/usr/local/bin".into())];
        let found = emulator.wrap(&mut rooted, &["node".into()]);
        assert_eq!(found[1], "/usr/local/bin/node");
        assert_eq!(emulator.wrap(&mut rooted, &["python".into()])[1], "python");
        assert_eq!(
            sandbox.binds,
            [Bind::read_only(
                "/usr/bin/qemu-aarch64-static",
                "/usr/libexec/kiln/qemu-aarch64-static"
            )]
        );
    }

    #[test]
    fn the_registration_names_the_cpu_s_elf_magic_and_holds_the_emulator_open() {
        let emulator = |path: &str, machine: &str| Emulator {
            path: path.into(),
            name: format!("qemu-{machine}-static"),
            machine: machine.into(),
        };
        assert_eq!(
            emulator("/usr/bin/qemu-aarch64-static", "aarch64")
                .entry()
                .unwrap(),
            concat!(
                r":kiln-aarch64:M::\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00",
                r"\x02\x00\xb7\x00:\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff",
                r"\xff\xff\xfe\xff\xff\xff:/usr/bin/qemu-aarch64-static:F"
            )
        );
        let x86 = emulator("/q/qemu-x86_64-static", "x86_64").entry().unwrap();
        assert!(x86.contains(r"\x02\x00\x3e\x00:"), "{x86}");
        // The registration's fields are `:`-separated: a path with one cannot be carried.
        assert_eq!(
            emulator("/a:b/qemu-aarch64-static", "aarch64").entry(),
            None
        );
        assert_eq!(emulator("/q/qemu-riscv64-static", "riscv64").entry(), None);
        assert!(
            emulator("/q/qemu-riscv64-static", "riscv64")
                .children()
                .is_err()
        );
    }
}
