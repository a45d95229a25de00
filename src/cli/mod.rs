//! Command-line parsing and its validation into plain config structs: the only place that
//! reads the environment (with `telemetry`). Past this module no code sees clap types.

pub mod base;
mod build;
mod cache;
mod controller;
mod dev;
mod git;
mod init;
mod install;
mod rebase;
mod registry;
mod report;
mod run;
pub mod termination;
mod verify;
mod warm;
mod webhook;

use clap::{Parser, Subcommand};

pub use crate::telemetry::LogFormat;

pub use build::BuildArgs;

/// kiln builds serverless Functions into OCI images: daemonless, rootless and reproducible.
///
/// It appends a dependency layer and a source layer to a runtime base image by reference,
/// computes config and manifest itself, and pushes only the blobs the registry lacks.
#[derive(Debug, Parser)]
#[command(name = "kiln", version, propagate_version = true, max_term_width = 100)]
pub struct Cli {
    /// Global options.
    #[command(flatten)]
    pub global: GlobalArgs,
    /// The command to run.
    #[command(subcommand)]
    pub command: Command,
}

/// Options for every command.
#[derive(Debug, clap::Args)]
pub struct GlobalArgs {
    /// Log format on stderr: `auto` is a compact human view on a terminal and plain lines
    /// otherwise; `json` is one JSON object per line (build Jobs).
    #[arg(
        long,
        global = true,
        value_enum,
        default_value_t = LogFormat::Auto,
        env = "KILN_LOG_FORMAT",
    )]
    pub log_format: LogFormat,
    /// More output (-v debug, -vv trace). `RUST_LOG` overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Only warnings and errors on stderr.
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    pub quiet: bool,
}

/// kiln's commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Build a Function into an image and push it (or write an OCI layout).
    ///
    /// Prints exactly one line on stdout: `REPO@sha256:…` (or `oci:DIR@sha256:…`).
    /// Exit codes: 0 built, 1 build failed, 2 bad usage or input.
    Build(Box<BuildArgs>),
    /// Assemble runtime base and builder images from Debian packages and npm (recipes in
    /// base-images/), reproducibly, without a daemon or root.
    #[command(subcommand)]
    Base(Box<base::BaseCommand>),
    /// Write a new Function: a handler from Kyma's templates, an empty dependency manifest,
    /// a .kilnignore, and with --manifest a Kyma Function YAML. Never overwrites a file.
    Init(Box<init::InitArgs>),
    /// Build, run and watch a Function: on every save it is built again and swapped in.
    ///
    /// The Function answers on http://127.0.0.1:PORT through the whole loop: a source-only
    /// change is back in well under a second, and a failed build leaves the last good one
    /// answering. Ctrl-C stops.
    Dev(Box<dev::DevArgs>),
    /// Run an image's function locally in a rootless sandbox.
    ///
    /// Takes what `kiln build` prints. The function's stdout and stderr pass through; kiln
    /// exits with the function's exit code (128+N when killed by signal N).
    Run(Box<run::RunArgs>),
    /// Serve the admission webhook for Functions: defaulting (POST /mutate) and validation
    /// (POST /validate), AdmissionReview v1 over HTTPS.
    Webhook(Box<webhook::WebhookArgs>),
    /// Print the Function CRD (functions.serverless.kyma-project.io, v1alpha2) as YAML, for
    /// `kubectl apply -f -`.
    Crd,
    /// Run the Function controller: build Functions with build Jobs and run them.
    Controller(Box<controller::ControllerArgs>),
    /// Prepare a registry before the first build: copy each runtime's base and builder images
    /// into it, and pre-build Functions' dependency layers into the cache repository.
    ///
    /// What is there already is left alone: a second run uploads nothing.
    Warm(Box<warm::WarmArgs>),
    /// Check an image's signature: that a signature stored as cosign stores it (the
    /// `sha256-<digest>.sig` tag, as `kiln build --sign-key` and `cosign sign` write it) was
    /// made by the key's owner over the image's manifest digest.
    ///
    /// Prints the verified digest. Exit codes: 0 verified, 1 not verified (the reason on
    /// stderr), 2 bad usage or input.
    Verify(Box<verify::VerifyArgs>),
    /// Move a Function image onto a new base image without a build: the new base's layers,
    /// the Function's own layers as they are, and the config a build on the new base writes,
    /// pushed with blob mounts (no layer bytes move) and the manifest last.
    ///
    /// Refused, with the reason (exit 3), when a build on the new base would install the
    /// dependencies differently. Prints the rebased image's reference.
    Rebase(Box<rebase::RebaseArgs>),
    /// Manage the cache directory (`kiln cache prune`).
    #[command(subcommand)]
    Cache(cache::CacheCommand),
    /// Print a shell completion script, generated from kiln's flags.
    ///
    /// bash: `kiln completions bash > /usr/share/bash-completion/completions/kiln`; zsh:
    /// `kiln completions zsh > "${fpath[1]}/_kiln"`; fish: `kiln completions fish >
    /// ~/.config/fish/completions/kiln.fish`.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print kiln's man page (roff): `kiln man > /usr/share/man/man1/kiln.1`; with --dir,
    /// write it and a page per command (kiln-build.1, …) into that directory.
    Man {
        /// Write kiln.1 and every command's page here instead.
        #[arg(long, value_name = "DIR")]
        dir: Option<std::path::PathBuf>,
    },
    /// Print the version.
    Version,
}

/// A failed command: a usage/input problem (exit 2) or a failed build (exit 1).
#[derive(Debug)]
pub enum Failure {
    /// Bad flags or input: the user must change something.
    Usage(anyhow::Error),
    /// The build ran and failed.
    Build(anyhow::Error),
    /// Exit with this code and print nothing more (`kiln run`: the function's exit code).
    Exit(u8),
}

impl Command {
    /// The Tokio runtime this command runs on. A build is one pipeline whose CPU-heavy steps
    /// (layer writing, unpacking, hashing whole files) run on the blocking pool and whose
    /// async side mostly waits on the network, so one thread serves it, without the hand-offs
    /// between threads a multi-threaded runtime makes on every wake-up (about 0.7 ms of an
    /// 8 ms no-change build). Servers and the commands whose main work is many downloads
    /// and unpacks side by side (`base`, `warm`, `run`) get a worker thread per core; a build
    /// that assembles its base images on first use does that work on its one thread.
    ///
    /// # Errors
    /// When the runtime cannot be started.
    pub fn runtime(&self) -> std::io::Result<tokio::runtime::Runtime> {
        match self {
            Command::Build(_) => tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build(),
            _ => tokio::runtime::Runtime::new(),
        }
    }
}

/// Runs `future` to its end on `runtime` and returns its output, waiting at most
/// `grace(&output)` for what it left running on the blocking pool. Once a command has
/// returned, nothing there is wanted: what is left is abandoned work, such as a speculative
/// connection's DNS lookup that hit the resolver's 5 s timeout, and dropping the runtime would
/// wait for it before the process could exit. An interrupted command is different: the layer
/// writes or the git fetch it left remove their temporary files as they end, so it is given
/// some time.
pub fn run_to_end<F: std::future::Future>(
    runtime: tokio::runtime::Runtime,
    future: F,
    grace: impl FnOnce(&F::Output) -> std::time::Duration,
) -> F::Output {
    let output = runtime.block_on(future);
    runtime.shutdown_timeout(grace(&output));
    output
}

/// Runs a parsed command and returns what to print on stdout.
///
/// # Errors
/// A [`Failure`] classifying the error for the exit code.
pub async fn run(cli: Cli) -> Result<String, Failure> {
    match cli.command {
        Command::Build(args) => build::run(*args).await,
        Command::Base(cmd) => base::run(*cmd).await,
        Command::Run(args) => run::run(*args).await,
        Command::Dev(args) => dev::run(*args).await,
        Command::Init(args) => init::run(&args),
        Command::Controller(args) => controller::run(*args).await,
        Command::Webhook(args) => webhook::run(*args).await,
        Command::Crd => crate::controller::crd::crd_yaml()
            .map(|yaml| yaml.trim_end().to_string())
            .map_err(|e| Failure::Build(e.into())),
        Command::Warm(args) => warm::run(*args).await,
        Command::Verify(args) => verify::run(*args).await,
        Command::Rebase(args) => rebase::run(*args).await,
        Command::Cache(cmd) => cache::run(cmd),
        Command::Completions { shell } => {
            let mut script = Vec::new();
            let mut command = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut command, "kiln", &mut script);
            generated(script)
        }
        Command::Man { dir: None } => {
            let mut page = Vec::new();
            clap_mangen::Man::new(<Cli as clap::CommandFactory>::command())
                .render(&mut page)
                .map_err(|e| Failure::Build(e.into()))?;
            generated(page)
        }
        Command::Man { dir: Some(dir) } => {
            clap_mangen::generate_to(<Cli as clap::CommandFactory>::command(), &dir).map_err(
                |e| {
                    Failure::Build(anyhow::anyhow!(
                        "writing man pages into {}: {e}",
                        dir.display()
                    ))
                },
            )?;
            Ok(dir.display().to_string())
        }
        Command::Version => Ok(format!("kiln {}", env!("CARGO_PKG_VERSION"))),
    }
}

/// A generated script or page as the line(s) to print (the printing adds the last newline).
fn generated(bytes: Vec<u8>) -> Result<String, Failure> {
    let text = String::from_utf8(bytes).map_err(|e| Failure::Build(e.into()))?;
    Ok(text.trim_end_matches('\n').to_string())
}

/// The cache directory: the flag, else `$XDG_CACHE_HOME/kiln`, else `~/.cache/kiln`.
///
/// # Errors
/// When none of them is set.
fn cache_dir(flag: Option<&std::path::Path>) -> anyhow::Result<std::path::PathBuf> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(std::path::PathBuf::from)
    };
    flag.map(std::path::Path::to_path_buf)
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("kiln")))
        .or_else(|| var("HOME").map(|h| h.join(".cache/kiln")))
        .ok_or_else(|| {
            anyhow::anyhow!("no cache directory: set --cache-dir, XDG_CACHE_HOME or HOME")
        })
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    #[test]
    fn a_command_that_returned_does_not_wait_for_blocking_work_it_left_behind() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let start = Instant::now();
        let left_behind = || {
            // As a speculative connection's DNS lookup left waiting on a lost answer.
            drop(tokio::task::spawn_blocking(|| {
                std::thread::sleep(Duration::from_secs(20));
            }));
        };
        let output = super::run_to_end(
            runtime,
            async {
                left_behind();
                7
            },
            |_| Duration::ZERO,
        );
        assert_eq!(output, 7);
        let took = start.elapsed();
        assert!(took < Duration::from_secs(10), "returned after {took:?}");
        // An interrupted command waits for it, up to its grace.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let start = Instant::now();
        super::run_to_end(runtime, async { left_behind() }, |()| {
            Duration::from_millis(300)
        });
        let took = start.elapsed();
        assert!(
            took >= Duration::from_millis(300) && took < Duration::from_secs(10),
            "returned after {took:?}"
        );
    }
}
