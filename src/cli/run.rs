//! `kiln run`: flags, their validation into [`crate::run::Options`], and the run. The
//! function's own stdout is the command's output, so this prints nothing itself.

use std::path::{Component, Path, PathBuf};

use anyhow::{Context, anyhow};
use clap::Args;

use super::Failure;
use super::registry::RegistryArgs;
use crate::oci::Platform;
use crate::registry::{Client, ClientConfig};
use crate::run::user::Ids;
use crate::run::{self, ImageRef, Options};
use crate::sandbox::Bind;

/// Flags of `kiln run`.
#[derive(Debug, Args)]
#[command(after_help = "\
The function runs in a rootless sandbox: bubblewrap when installed, else kiln's built-in one on \
util-linux `unshare` (KILN_SANDBOX=bwrap|builtin|auto chooses). Either gives the image's root \
filesystem read-only as /, a fresh writable tmpfs /tmp, /proc, a minimal /dev, the host's \
/etc/resolv.conf, the --volume binds, all capabilities dropped, and its own user, PID, IPC and \
UTS namespaces. It SHARES THE HOST NETWORK, so the function's port is reachable on the host \
(and the function can reach everything the host can). It runs as the image's User, or the \
--user ids (default root inside the sandbox, which is your own user, without capabilities, \
outside), with only the image's Env, the --env values and HOME. Layers are unpacked once per image \
    into the cache \
directory.

SIGINT and SIGTERM are forwarded to the function (a second one kills it). Exit code: the \
function's own, 128+N when signal N ended it, 1 when kiln failed, 2 for bad usage or input.

Examples:
  kiln run \"$(kiln build ./hello --runtime nodejs22 --output oci:./out)\" --port 8080
  kiln run registry.example.com/team/hello:1.0 --port 8080 --env LOG_LEVEL=debug
  kiln run oci:./out:latest -p 8080 -e NODE_ENV=development --user 10001
  kiln run oci:./out:latest --entrypoint '[\"/bin/sh\",\"-c\"]' -- 'echo hi'
  kiln run oci:./bases:python313-builder --volume ./bases:/workspace/bases:ro \\
    --volume ./fn:/workspace/src:ro --volume ./out:/workspace/out -- build /workspace/src \\
    --runtime python313 --base oci:/workspace/bases:python313 --output oci:/workspace/out")]
pub struct RunArgs {
    /// The image: what `kiln build` prints (REGISTRY/REPO@sha256:… or oci:DIR@sha256:…), a
    /// registry reference with a tag, or oci:DIR[:NAME].
    #[arg(value_name = "IMAGE")]
    pub image: String,
    /// Set FUNC_PORT=PORT for the function (the runtimes listen on it). The sandbox shares the
    /// host network, so the function answers on http://127.0.0.1:PORT.
    #[arg(long, short = 'p', value_parser = clap::value_parser!(u16).range(1..))]
    pub port: Option<u16>,
    /// Set an environment variable for the function, over the image's Env; repeatable.
    #[arg(long = "env", short = 'e', value_name = "KEY=VALUE")]
    pub env: Vec<String>,
    /// Bind a host file or directory into the sandbox at DEST (an absolute path), writable
    /// unless `:ro` is given; repeatable. HOST must exist; a relative HOST is taken from the
    /// current directory.
    // No `-v`: that is the global --verbose.
    #[arg(long = "volume", value_name = "HOST:DEST[:ro]")]
    pub volumes: Vec<String>,
    /// Run as these numeric ids instead of the image's User (a Pod's runAsUser/runAsGroup);
    /// GID defaults to UID.
    #[arg(long, value_name = "UID[:GID]")]
    pub user: Option<String>,
    /// Run this instead of the image's Entrypoint, without its Cmd (a Kubernetes container's
    /// `command`): a program, or a JSON array of strings such as '["/bin/sh","-c"]'; `''`
    /// leaves only the ARGS. The ARGS after `--` follow it.
    #[arg(long, value_name = "PROGRAM|JSON")]
    pub entrypoint: Option<String>,
    /// Platform to pick from a multi-platform image [default: this machine's, e.g. linux/amd64].
    /// An image for another CPU (linux/arm64 on an amd64 machine) runs under QEMU's user-mode
    /// emulator, qemu-MACHINE-static from PATH (Debian's qemu-user-static); the programs it
    /// starts too, where the kernel (Linux 6.7 or later) lets the sandbox have a binfmt_misc
    /// of its own.
    #[arg(long, value_name = "OS/ARCH[/VARIANT]")]
    pub platform: Option<String>,
    /// Registry access.
    #[command(flatten)]
    pub registry: RegistryArgs,
    /// Parallel layer downloads.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub jobs: u16,
    /// The most the image's files may unpack to, in bytes or with a K, M, G or T suffix
    /// (powers of 1024), each entry counting 512 bytes besides its contents; a layer that
    /// would unpack to more (a decompression bomb, a huge sparse file, a flood of empty
    /// directories) fails the run and leaves nothing in the cache. Apart from it, an image
    /// may hold at most 1,000,000 entries.
    #[arg(long, value_name = "SIZE", default_value = "8G", value_parser = parse_size)]
    pub max_unpacked_size: u64,
    /// Cache directory; unpacked images go under rootfs/
    /// [default: $XDG_CACHE_HOME/kiln or ~/.cache/kiln].
    #[arg(long, value_name = "DIR", env = "KILN_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Run this instead of the image's Cmd (its Entrypoint is kept).
    #[arg(last = true, value_name = "ARGS")]
    pub args: Vec<String>,
}

/// Runs the image; `Ok("")` when the function exited 0, [`Failure::Exit`] with its code
/// otherwise.
pub(super) async fn run(args: RunArgs) -> Result<String, Failure> {
    let (opts, volumes, config) = validate(&args).map_err(Failure::Usage)?;
    let client = Client::new(config)
        .context("setting up the registry client")
        .map_err(Failure::Usage)?;
    match run::run(&client, &opts, &volumes).await {
        Ok(0) => Ok(String::new()),
        Ok(code) => Err(Failure::Exit(code)),
        Err(e) => {
            if let Some(code) = e.interrupted_exit_code() {
                tracing::warn!("{e}");
                return Err(Failure::Exit(code));
            }
            let input = e.is_input_error();
            let e = anyhow::Error::new(e).context(format!("running {}", args.image));
            Err(if input {
                Failure::Usage(e)
            } else {
                Failure::Build(e)
            })
        }
    }
}

fn validate(args: &RunArgs) -> anyhow::Result<(Options, Vec<Bind>, ClientConfig)> {
    let image: ImageRef = args
        .image
        .parse()
        .with_context(|| format!("invalid image {:?}", args.image))?;
    let platform = match &args.platform {
        Some(p) => Platform::parse(p).ok_or_else(|| {
            anyhow!("invalid --platform {p:?}: expected OS/ARCH[/VARIANT], e.g. linux/amd64")
        })?,
        None => Platform::host(),
    };
    let mut vars = env_vars(&args.env)?;
    if let Some(port) = args.port {
        vars.push(("FUNC_PORT".into(), port.to_string()));
    }
    let volumes = match args.volumes.as_slice() {
        [] => Vec::new(),
        specs => {
            let cwd = std::env::current_dir().context("finding the current directory")?;
            let parse = |spec: &String| parse_volume(spec, &cwd);
            specs.iter().map(parse).collect::<anyhow::Result<_>>()?
        }
    };
    let cache_dir = super::cache_dir(args.cache_dir.as_deref())?;
    let user = match &args.user {
        Some(spec) => Some(
            spec.parse::<Ids>()
                .with_context(|| format!("invalid --user {spec:?}"))?,
        ),
        None => None,
    };
    let opts = Options {
        image,
        platform,
        cache_dir,
        env: vars,
        args: (!args.args.is_empty()).then(|| args.args.clone()),
        entrypoint: args
            .entrypoint
            .as_deref()
            .map(parse_entrypoint)
            .transpose()?,
        user,
        jobs: usize::from(args.jobs),
        max_unpacked: args.max_unpacked_size,
    };
    Ok((opts, volumes, args.registry.client_config()?))
}

/// Parses a size: bytes, or a number with a K, M, G or T suffix (binary; `Gi`, `GB` and
/// lowercase are the same).
/// `--env KEY=VALUE` values, in order.
pub(super) fn env_vars(entries: &[String]) -> anyhow::Result<Vec<(String, String)>> {
    entries
        .iter()
        .map(|entry| {
            entry
                .split_once('=')
                .filter(|(k, _)| !k.is_empty())
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .ok_or_else(|| {
                    anyhow!(
                        "invalid --env {entry:?}: expected KEY=VALUE, e.g. --env LOG_LEVEL=debug"
                    )
                })
        })
        .collect()
}

pub(super) fn parse_size(spec: &str) -> Result<u64, String> {
    let upper = spec.trim().to_ascii_uppercase();
    let digits = upper.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let shift = match upper[digits.len()..].trim_end_matches(['B', 'I']) {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => {
            return Err(format!(
                "{spec:?} is not a size: use bytes or a K, M, G or T suffix"
            ));
        }
    };
    let n: u64 = digits
        .trim()
        .parse()
        .map_err(|_| format!("{spec:?} is not a size: use bytes or a K, M, G or T suffix"))?;
    n.checked_shl(shift)
        .filter(|v| v >> shift == n && *v > 0)
        .ok_or_else(|| format!("{spec:?} is out of range"))
}

/// Parses `--entrypoint`: a JSON array of strings when it starts with `[`, nothing when
/// empty, else one program (podman's rules).
fn parse_entrypoint(spec: &str) -> anyhow::Result<Vec<String>> {
    if spec.trim_start().starts_with('[') {
        return serde_json::from_str(spec).with_context(|| {
            format!("invalid --entrypoint {spec:?}: expected a JSON array of strings")
        });
    }
    Ok(if spec.is_empty() {
        Vec::new()
    } else {
        vec![spec.to_string()]
    })
}

/// Parses `--volume HOST:DEST[:ro|:rw]` (as `docker run -v`). HOST may contain `:`; DEST
/// may not.
fn parse_volume(spec: &str, cwd: &Path) -> anyhow::Result<Bind> {
    let usage = || {
        anyhow!("invalid --volume {spec:?}: expected HOST:DEST[:ro], e.g. ./src:/workspace/src:ro")
    };
    let (rest, writable) = match spec.rsplit_once(':') {
        Some((rest, mode)) if rest.contains(':') && !mode.starts_with('/') => match mode {
            "ro" => (rest, false),
            "rw" => (rest, true),
            _ => {
                return Err(anyhow!(
                    "invalid --volume {spec:?}: unknown mode {mode:?}; use :ro for read-only, \
                     or nothing (or :rw) for writable"
                ));
            }
        },
        _ => (spec, true),
    };
    let (host, dest) = rest
        .rsplit_once(':')
        .filter(|(host, dest)| !host.is_empty() && !dest.is_empty())
        .ok_or_else(usage)?;
    let dest_path = Path::new(dest);
    if !dest_path.is_absolute() {
        return Err(anyhow!(
            "invalid --volume {spec:?}: DEST {dest:?} must be an absolute path in the sandbox, \
             e.g. /workspace/{dest}"
        ));
    }
    if dest_path.parent().is_none() || dest_path.components().any(|c| c == Component::ParentDir) {
        return Err(anyhow!(
            "invalid --volume {spec:?}: DEST {dest:?} must name a directory or file below / \
             without `..`, e.g. /workspace/src"
        ));
    }
    let host = std::path::absolute(cwd.join(host))
        .with_context(|| format!("invalid --volume {spec:?}: resolving {host:?}"))?;
    if !host.exists() {
        return Err(anyhow!(
            "invalid --volume {spec:?}: the host path {} does not exist; create it first or \
             fix the path",
            host.display()
        ));
    }
    Ok(if writable {
        Bind::writable(host, dest)
    } else {
        Bind::read_only(host, dest)
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn err(spec: &str, cwd: &Path) -> String {
        format!("{:#}", parse_volume(spec, cwd).unwrap_err())
    }

    #[test]
    fn volumes_are_writable_unless_read_only_and_relative_hosts_are_made_absolute() {
        let dir = tempfile::tempdir().unwrap();
        let cwd = dir.path();
        std::fs::create_dir(cwd.join("src")).unwrap();
        let src = cwd.join("src");
        let bind = parse_volume("src:/workspace/src:ro", cwd).unwrap();
        assert_eq!(bind, Bind::read_only(&src, "/workspace/src"));
        let bind = parse_volume("./src:/workspace/out", cwd).unwrap();
        assert_eq!(bind, Bind::writable(&src, "/workspace/out"));
        let spec = format!("{}:/w:rw", src.display());
        assert_eq!(
            parse_volume(&spec, cwd).unwrap(),
            Bind::writable(&src, "/w")
        );
    }

    #[test]
    fn an_entrypoint_is_a_program_or_a_json_array() {
        assert_eq!(parse_entrypoint("/bin/sh").unwrap(), ["/bin/sh"]);
        assert_eq!(
            parse_entrypoint(r#"["/bin/sh", "-c"]"#).unwrap(),
            ["/bin/sh", "-c"]
        );
        assert!(parse_entrypoint("").unwrap().is_empty());
        let e = format!("{:#}", parse_entrypoint(r#"["/bin/sh", 1]"#).unwrap_err());
        assert!(e.contains("JSON array of strings"), "{e}");
    }

    #[test]
    fn run_flags_do_not_clash_with_the_global_ones() {
        use clap::CommandFactory;
        crate::cli::Cli::command().debug_assert();
    }

    #[test]
    fn a_host_path_may_contain_colons() {
        let dir = tempfile::tempdir().unwrap();
        let odd = dir.path().join("a:b");
        std::fs::write(&odd, b"x").unwrap();
        let bind = parse_volume("a:b:/etc/x:ro", dir.path()).unwrap();
        assert_eq!(bind, Bind::read_only(&odd, "/etc/x"));
    }

    #[test]
    fn bad_volumes_say_what_is_wrong_and_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let cwd = dir.path();
        for spec in ["src", ":/x", "src:"] {
            assert!(err(spec, cwd).contains("expected HOST:DEST[:ro]"), "{spec}");
        }
        let e = err("missing:/x", cwd);
        assert!(e.contains("does not exist") && e.contains("missing"), "{e}");
        assert!(err(".:rel/x", cwd).contains("must be an absolute path"));
        assert!(err("/x:ro", cwd).contains("DEST \"ro\" must be an absolute path"));
        assert!(err(".:/x:rx", cwd).contains("unknown mode \"rx\""));
        assert!(err(".:/", cwd).contains("below /"));
        assert!(err(".:/a/../etc", cwd).contains("without `..`"));
    }
}
