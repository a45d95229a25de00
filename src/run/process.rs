//! From an unpacked image to a running sandboxed process: the command line (Entrypoint +
//! Cmd), environment, working directory and user from the image config; then waiting for it
//! while forwarding SIGINT/SIGTERM, and turning its end into an exit code.

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;

use tokio::signal::unix::{SignalKind, signal};

use super::{Error, Options, user};
use crate::oci::ImageConfig;
use crate::rootpath::{self, Last};
use crate::sandbox::{self, Bind, Sandbox, Signal};

/// The host's DNS configuration, bound read-only into the sandbox when present.
const HOST_RESOLV_CONF: &str = "/etc/resolv.conf";

/// What to start: the sandbox and the command inside it.
#[derive(Clone, Debug)]
pub struct Launch {
    /// The sandbox.
    pub sandbox: Sandbox,
    /// Entrypoint followed by Cmd (or the caller's arguments).
    pub argv: Vec<String>,
}

/// Works out how to run the image unpacked at `rootfs`, with `volumes` bound in last (so one
/// may replace `/etc/resolv.conf` or sit below `/tmp`). Reads the image's `/etc/passwd` and
/// `/etc/group` for a named user.
///
/// # Errors
/// No command to run, an unknown user or group, a missing working directory.
pub fn plan(
    rootfs: &Path,
    config: &ImageConfig,
    opts: &Options,
    volumes: &[Bind],
) -> Result<Launch, Error> {
    let run = config.config.clone().unwrap_or_default();
    let argv = command_line(&run, opts);
    if argv.is_empty() {
        return Err(Error::NoCommand);
    }
    let passwd = user::read_image_file(rootfs, "/etc/passwd")?;
    let user = match opts.user {
        Some(ids) => user::with_ids(ids, &passwd),
        None => {
            let group = user::read_image_file(rootfs, "/etc/group")?;
            user::resolve(run.user.as_deref(), &passwd, &group)?
        }
    };
    let cwd = match run.working_dir.as_deref().filter(|d| !d.is_empty()) {
        Some(dir) => Path::new("/").join(dir).to_string_lossy().into_owned(),
        None => "/".to_string(),
    };
    if !rootpath::resolve(rootfs, Path::new(&cwd), Last::Follow)?.is_dir() {
        return Err(Error::NoWorkingDir(cwd));
    }
    let home = user.home.clone().unwrap_or_else(|| "/".into());
    let env = environment(run.env_pairs(), &opts.env, &home);
    let mut binds = vec![Bind::read_only(HOST_RESOLV_CONF, HOST_RESOLV_CONF).optional()];
    binds.extend_from_slice(volumes);
    let sandbox = Sandbox {
        binds,
        env,
        cwd,
        uid: user.uid,
        gid: user.gid,
        // The function must be reachable on the host's ports (FUNC_PORT).
        share_network: true,
        ..Sandbox::new(rootfs)
    };
    Ok(Launch { sandbox, argv })
}

/// Entrypoint (the caller's, or the image's) followed by the caller's arguments, or the
/// image's Cmd when the caller replaced neither.
fn command_line(run: &crate::oci::RunConfig, opts: &Options) -> Vec<String> {
    let mut argv = match &opts.entrypoint {
        Some(entrypoint) => entrypoint.clone(),
        None => run.entrypoint.clone().unwrap_or_default(),
    };
    let cmd = match (&opts.args, &opts.entrypoint) {
        (Some(args), _) => args.clone(),
        // A new entrypoint does not inherit the old one's default arguments.
        (None, Some(_)) => Vec::new(),
        (None, None) => run.cmd.clone().unwrap_or_default(),
    };
    argv.extend(cmd);
    argv
}

/// The image's entries, then `overrides` (replacing in place), then `HOME` when neither sets
/// it.
fn environment(
    image: Vec<(String, String)>,
    overrides: &[(String, String)],
    home: &str,
) -> Vec<(String, String)> {
    let mut env = image;
    for (key, value) in overrides {
        match env.iter_mut().find(|(k, _)| k == key) {
            Some(entry) => entry.1 = value.clone(),
            None => env.push((key.clone(), value.clone())),
        }
    }
    if !env.iter().any(|(k, _)| k == "HOME") {
        env.push(("HOME".into(), home.into()));
    }
    env
}

/// SIGINT and SIGTERM, caught from the moment this exists (instead of killing kiln).
#[derive(Debug)]
pub struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

impl Signals {
    /// Installs the handlers.
    ///
    /// # Errors
    /// When the runtime cannot register them.
    pub fn install() -> Result<Signals, Error> {
        let register = |kind| signal(kind).map_err(|source| Error::Signals { source });
        Ok(Signals {
            interrupt: register(SignalKind::interrupt())?,
            terminate: register(SignalKind::terminate())?,
        })
    }

    /// The next signal received.
    pub async fn recv(&mut self) -> Signal {
        tokio::select! {
            _ = self.interrupt.recv() => Signal::Interrupt,
            _ = self.terminate.recv() => Signal::Terminate,
        }
    }
}

/// Starts `launch` and waits for it, forwarding the first SIGINT/SIGTERM into the sandbox
/// and answering a second one with SIGKILL. Returns the exit code to exit with: the
/// process's own, or 128 + the signal that killed it.
///
/// # Errors
/// When bwrap cannot be started or waited for, or a signal cannot be delivered.
pub async fn supervise(launch: &Launch, signals: &mut Signals) -> Result<u8, Error> {
    let mut child = launch
        .sandbox
        .command(&launch.argv)?
        .spawn()
        .map_err(|source| Error::Spawn { source })?;
    let pid = child.id();
    let mut received = 0;
    loop {
        tokio::select! {
            status = child.wait() => {
                let status = status.map_err(|source| Error::Wait { source })?;
                return Ok(exit_code(status));
            }
            got = signals.recv() => {
                received += 1;
                let Some(pid) = pid else { continue };
                let signal = if received == 1 { got } else { Signal::Kill };
                let delivery = tokio::task::spawn_blocking(move || {
                    sandbox::forward_signal(pid, signal)
                })
                .await
                .map_err(Error::Task)??;
                tracing::info!(%got, sent = %signal, ?delivery, "forwarded signal to the function");
            }
        }
    }
}

fn exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code).unwrap_or(1),
        (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(255),
        (None, None) => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    fn opts(env: &[(&str, &str)], args: Option<&[&str]>) -> Options {
        Options {
            image: "oci:x".parse().unwrap(),
            platform: crate::oci::Platform::linux_amd64(),
            cache_dir: "/nonexistent".into(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            args: args.map(|a| a.iter().map(|s| s.to_string()).collect()),
            entrypoint: None,
            user: None,
            jobs: 1,
            max_unpacked: 1 << 20,
        }
    }

    fn config(json: &str) -> ImageConfig {
        let raw = format!(
            r#"{{"architecture":"amd64","os":"linux","rootfs":{{"type":"layers","diff_ids":[]}},
            "config":{json}}}"#
        );
        serde_json::from_str(&raw).unwrap()
    }

    fn rootfs() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("etc")).unwrap();
        std::fs::create_dir_all(dir.path().join("srv/app")).unwrap();
        std::fs::write(
            dir.path().join("etc/passwd"),
            "root:x:0:0::/root:/bin/sh\napp:x:1000:1000::/home/app:/bin/sh\n",
        )
        .unwrap();
        dir
    }

    #[test]
    fn the_launch_follows_the_image_config() {
        let dir = rootfs();
        let cfg = config(
            r#"{"Entrypoint":["/bin/sh","-c"],"Cmd":["exec serve"],"User":"app",
            "WorkingDir":"srv/app","Env":["PATH=/bin","FUNC_PORT=8080","ODD"]}"#,
        );
        let launch = plan(dir.path(), &cfg, &opts(&[("FUNC_PORT", "9000")], None), &[]).unwrap();
        assert_eq!(launch.argv, ["/bin/sh", "-c", "exec serve"]);
        let s = &launch.sandbox;
        assert_eq!((s.uid, s.gid), (1000, 1000));
        assert_eq!(s.cwd, "/srv/app");
        assert!(s.share_network && s.read_only_root);
        assert_eq!(s.tmpfs, ["/tmp"]);
        let env: Vec<String> = s.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        assert_eq!(env, ["PATH=/bin", "FUNC_PORT=9000", "HOME=/home/app"]);
        assert_eq!(s.binds[0].dest, "/etc/resolv.conf");
        assert!(s.binds[0].optional && !s.binds[0].writable);
    }

    #[test]
    fn arguments_replace_cmd_but_keep_the_entrypoint() {
        let dir = rootfs();
        let cfg = config(r#"{"Entrypoint":["/bin/echo"],"Cmd":["default"],"Env":["HOME=/x"]}"#);
        let launch = plan(dir.path(), &cfg, &opts(&[], Some(&["hi"])), &[]).unwrap();
        assert_eq!(launch.argv, ["/bin/echo", "hi"]);
        assert_eq!(launch.sandbox.env, [("HOME".to_string(), "/x".to_string())]);
        assert_eq!((launch.sandbox.uid, launch.sandbox.cwd.as_str()), (0, "/"));
    }

    #[test]
    fn an_entrypoint_drops_the_images_cmd_and_ids_replace_its_user() {
        let dir = rootfs();
        let cfg = config(r#"{"Entrypoint":["/bin/echo"],"Cmd":["default"],"User":"app"}"#);
        let mut o = opts(&[], None);
        o.entrypoint = Some(vec!["/bin/sh".into(), "-c".into()]);
        o.user = Some(user::Ids {
            uid: 10001,
            gid: 10002,
        });
        let launch = plan(dir.path(), &cfg, &o, &[]).unwrap();
        assert_eq!(launch.argv, ["/bin/sh", "-c"]);
        assert_eq!((launch.sandbox.uid, launch.sandbox.gid), (10001, 10002));
        assert!(launch.sandbox.env.contains(&("HOME".into(), "/".into())));
        o.args = Some(vec!["exit 3".into()]);
        o.user = Some(user::Ids { uid: 1000, gid: 7 });
        let launch = plan(dir.path(), &cfg, &o, &[]).unwrap();
        assert_eq!(launch.argv, ["/bin/sh", "-c", "exit 3"]);
        assert!(
            launch
                .sandbox
                .env
                .contains(&("HOME".into(), "/home/app".into()))
        );
        o.entrypoint = Some(vec![]);
        o.args = None;
        assert!(matches!(
            plan(dir.path(), &cfg, &o, &[]),
            Err(Error::NoCommand)
        ));
    }

    #[test]
    fn volumes_are_bound_after_the_resolver_config_as_given() {
        let dir = rootfs();
        let cfg = config(r#"{"Cmd":["x"]}"#);
        let volumes = [
            Bind::read_only("/host/src", "/workspace/src"),
            Bind::writable("/host/out", "/workspace/out"),
        ];
        let launch = plan(dir.path(), &cfg, &opts(&[], None), &volumes).unwrap();
        assert_eq!(launch.sandbox.binds[0].dest, HOST_RESOLV_CONF);
        assert_eq!(launch.sandbox.binds[1..], volumes);
        let args: Vec<String> = crate::sandbox::bwrap::args(&launch.sandbox, &launch.argv)
            .unwrap()
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let line = args.join(" ");
        assert!(
            line.contains("--ro-bind /host/src /workspace/src --bind /host/out /workspace/out"),
            "{line}"
        );
    }

    #[test]
    fn images_without_command_or_working_directory_are_refused() {
        let dir = rootfs();
        let none = plan(dir.path(), &config("{}"), &opts(&[], None), &[]);
        assert!(matches!(none, Err(Error::NoCommand)));
        let cfg = config(r#"{"Cmd":["x"],"WorkingDir":"/missing"}"#);
        let missing = plan(dir.path(), &cfg, &opts(&[], None), &[]);
        assert!(matches!(missing, Err(Error::NoWorkingDir(d)) if d == "/missing"));
    }

    #[test]
    fn exit_codes_follow_the_shell_convention() {
        assert_eq!(exit_code(ExitStatus::from_raw(42 << 8)), 42);
        assert_eq!(exit_code(ExitStatus::from_raw(15)), 143);
        assert_eq!(exit_code(ExitStatus::from_raw(0)), 0);
    }
}
