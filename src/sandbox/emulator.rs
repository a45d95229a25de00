//! User-mode emulation for a sandbox whose programs are built for another CPU: QEMU's static
//! user-mode emulator (Debian's `qemu-user-static`), run directly as the sandbox's first
//! program with the foreign program as its argument. binfmt_misc, which would make the kernel
//! do this for every foreign executable, needs root to set up and is global, so it is not
//! used: a process the emulated program starts (a shell, a compiler) is not emulated, and
//! fails to start.

use std::path::{Path, PathBuf};

use super::{Bind, Sandbox};
use crate::rootpath::Last;

/// Where the emulator appears in the sandbox.
const INSIDE: &str = "/usr/libexec/kiln";

/// Lets a foreign program run in a sandbox.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Emulator {
    /// The static emulator on the host (`/usr/bin/qemu-aarch64-static`).
    pub path: PathBuf,
    /// Its file name, which it also has in the sandbox.
    name: String,
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
            Some(path) => Ok(Some(Emulator { path, name })),
            None => Err(Error::Missing {
                platform: platform.into(),
                host,
                program: name,
            }),
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
}
