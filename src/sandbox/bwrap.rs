//! bubblewrap (`bwrap`): the command line that runs a [`Sandbox`], and the check that bwrap
//! is installed and can create a user namespace.

use std::ffi::OsString;
use std::path::Path;

use super::{Bind, Error, Result, Sandbox};
use crate::rootpath::{self, Last};

/// The bubblewrap program, looked up on `PATH`.
pub const BWRAP: &str = "bwrap";

/// `dest` (absolute, as the sandbox sees it) resolved inside the root filesystem, as the path
/// bwrap must be given: bwrap follows a symlink in a destination from outside the new root,
/// so an image whose `/etc` links to a host path would have a bind land on the host.
///
/// # Errors
/// [`Error::MountPoint`] when it resolves nowhere inside the root (a loop, a directory kiln
/// may not search): bwrap, given the path as it is, would follow the image's links from its
/// setup root, where the host is.
fn inside(sandbox: &Sandbox, dest: &str) -> Result<String> {
    let refused = |reason: String| Error::MountPoint {
        dest: dest.to_string(),
        reason,
    };
    let resolved = rootpath::resolve(&sandbox.rootfs, Path::new(dest), Last::Follow)
        .map_err(|e| refused(e.to_string()))?;
    let rel = resolved
        .strip_prefix(&sandbox.rootfs)
        .map_err(|_| refused("it resolves outside the root".into()))?;
    Ok(format!("/{}", rel.display()))
}

/// The `bwrap` arguments that run `argv` in `sandbox`.
///
/// # Errors
/// A mount point that resolves nowhere inside the root ([`inside`]).
pub fn args(sandbox: &Sandbox, argv: &[String]) -> Result<Vec<OsString>> {
    let mut args: Vec<OsString> = Vec::new();
    let mut push = |items: &[&str]| args.extend(items.iter().map(OsString::from));
    let (uid, gid) = (sandbox.uid.to_string(), sandbox.gid.to_string());
    push(&["--unshare-user", "--uid", &uid, "--gid", &gid]);
    push(&["--unshare-pid", "--unshare-ipc", "--unshare-uts"]);
    if !sandbox.share_network {
        push(&["--unshare-net"]);
    }
    if let Some(name) = &sandbox.hostname {
        push(&["--hostname", name]);
    }
    push(&["--die-with-parent"]);
    if sandbox.new_session {
        push(&["--new-session"]);
    }
    // Without this bwrap keeps every capability (inside the user namespace) for uid 0.
    push(&["--cap-drop", "ALL"]);
    // The root is bound writable and remounted read-only at the end: bwrap has to create
    // missing mount points, which a read-only bind would refuse.
    args.extend(["--bind".into(), sandbox.rootfs.clone().into(), "/".into()]);
    let (proc, dev) = (inside(sandbox, "/proc")?, inside(sandbox, "/dev")?);
    let mut push = |items: &[&str]| args.extend(items.iter().map(OsString::from));
    push(&["--proc", &proc, "--dev", &dev]);
    for dir in &sandbox.tmpfs {
        push(&["--tmpfs", &inside(sandbox, dir)?]);
    }
    for bind in &sandbox.binds {
        args.extend([
            flag(bind).into(),
            bind.source.clone().into(),
            inside(sandbox, &bind.dest)?.into(),
        ]);
    }
    let mut push = |items: &[&str]| args.extend(items.iter().map(OsString::from));
    if sandbox.read_only_root {
        push(&["--remount-ro", "/"]);
    }
    push(&["--chdir", &sandbox.cwd, "--"]);
    args.extend(argv.iter().map(OsString::from));
    Ok(args)
}

/// bwrap's option for `bind`.
fn flag(bind: &Bind) -> &'static str {
    match (bind.writable, bind.optional) {
        (true, false) => "--bind",
        (true, true) => "--bind-try",
        (false, false) => "--ro-bind",
        (false, true) => "--ro-bind-try",
    }
}

/// Checks that `program` (bwrap) runs and can create a user namespace, with
/// `bwrap --unshare-user --ro-bind / / bwrap --version`.
///
/// # Errors
/// [`super::Error::Missing`] when it is not installed, [`super::Error::NoUserNamespaces`],
/// [`super::Error::Spawn`].
pub(super) async fn probe(program: &str) -> Result<()> {
    let mut cmd = tokio::process::Command::new(program);
    cmd.args([
        "--unshare-user",
        "--ro-bind",
        "/",
        "/",
        program,
        "--version",
    ]);
    super::run_probe(BWRAP, &mut cmd).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::Error;

    fn strings(args: Vec<OsString>) -> Vec<String> {
        args.into_iter().map(|a| a.into_string().unwrap()).collect()
    }

    #[test]
    fn a_default_sandbox_is_read_only_without_network_and_drops_capabilities() {
        let args = strings(
            args(
                &Sandbox::new("/cache/rootfs"),
                &["/bin/sh".into(), "-c".into()],
            )
            .unwrap(),
        );
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
        let args = strings(args(&sandbox, &["node".into()]).unwrap());
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
    fn a_mount_point_that_resolves_nowhere_in_the_root_is_refused() {
        // An image whose links loop where a bind goes: resolved from bwrap's setup root (the
        // host's, as /oldroot), they could lead anywhere; the sandbox does not start.
        let root = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/b", root.path().join("a")).unwrap();
        std::os::unix::fs::symlink("/a", root.path().join("b")).unwrap();
        let sandbox = Sandbox {
            binds: vec![Bind::read_only("/x", "/a/resolv.conf")],
            ..Sandbox::new(root.path())
        };
        let err = args(&sandbox, &["true".into()]).unwrap_err();
        assert!(matches!(err, Error::MountPoint { .. }), "{err:?}");
        assert!(err.to_string().contains("/a/resolv.conf"), "{err}");
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
        probe(BWRAP).await.unwrap();
    }
}
