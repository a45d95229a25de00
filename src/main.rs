//! The `kiln` binary: parse, set up telemetry, run, print the result, map the outcome to an
//! exit code.

use std::process::ExitCode;

use clap::Parser;
use kiln::cli::{self, Cli, Failure};

/// kiln's exit codes.
#[derive(Clone, Copy)]
enum Exit {
    Success = 0,
    Failed = 1,
    Usage = 2,
    Interrupted = 130,
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> ExitCode {
        ExitCode::from(e as u8)
    }
}

fn main() -> ExitCode {
    // The built-in sandbox's init process, the network gate's helper and the emulator's
    // registration are this binary; they must run before any thread.
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if let Some(code) = kiln::sandbox::builtin::dispatch(&args) {
        return code;
    }
    if let Some(code) = kiln::sandbox::gate::dispatch(&args) {
        return code;
    }
    if let Some(code) = kiln::sandbox::emulator::dispatch(&args) {
        return code;
    }
    // A git-over-SSH connection's `ssh` and `askpass` are this binary too.
    if let Some(code) = kiln::git::ssh::dispatch(&args) {
        return code;
    }
    let cli = match Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(e) => {
            cli::termination::record_parse_error(&args, &e);
            e.exit()
        }
    };
    match cli.command.runtime() {
        // Interrupted, the command's blocking work may clean up for a while.
        Ok(runtime) => ExitCode::from(cli::run_to_end(runtime, run(cli), |&code| {
            match code == Exit::Interrupted as u8 {
                true => std::time::Duration::from_secs(10),
                false => std::time::Duration::ZERO,
            }
        })),
        Err(e) => {
            eprintln!("error: starting the async runtime: {e}");
            Exit::Failed.into()
        }
    }
}

async fn run(cli: Cli) -> u8 {
    let steps = matches!(cli.command, cli::Command::Build(_) | cli::Command::Dev(_));
    let g = &cli.global;
    kiln::telemetry::init(g.log_format, g.verbose, g.quiet, steps);
    // `kiln run` forwards SIGINT/SIGTERM to the function and exits with its exit code;
    // `kiln webhook` shuts down gracefully on them, and `kiln dev` stops its Function.
    let outcome = if matches!(
        cli.command,
        cli::Command::Run(_) | cli::Command::Webhook(_) | cli::Command::Dev(_)
    ) {
        cli::run(cli).await
    } else {
        tokio::select! {
            outcome = cli::run(cli) => outcome,
            _ = tokio::signal::ctrl_c() => {
                eprintln!("kiln: interrupted");
                return Exit::Interrupted as u8;
            }
        }
    };
    match outcome {
        Ok(stdout) => {
            if !stdout.is_empty() {
                println!("{stdout}");
            }
            Exit::Success as u8
        }
        Err(Failure::Usage(e)) => {
            eprintln!("error: {e:#}");
            Exit::Usage as u8
        }
        Err(Failure::Build(e)) => {
            eprintln!("error: {e:#}");
            Exit::Failed as u8
        }
        Err(Failure::Exit(code)) => code,
    }
}
