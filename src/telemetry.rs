//! Tracing setup, called once from `main`: a compact human view on a terminal (with live
//! progress lines for long steps), plain lines with timestamps otherwise, or JSON lines; all
//! on stderr, filtered by `RUST_LOG` or -v/-q.

use std::io::IsTerminal;

use clap::ValueEnum;
use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human view on a terminal, plain lines otherwise.
    Auto,
    /// Plain text lines with timestamps.
    Text,
    /// JSON lines.
    Json,
}

/// Installs the global subscriber: `format`, with `verbose` (-v count) or `quiet` (-q).
/// `steps`: the command shows a step list in the human view (`kiln build`).
pub fn init(format: LogFormat, verbose: u8, quiet: bool, steps: bool) {
    let tty = std::io::stderr().is_terminal();
    // On a terminal, long steps are live lines (`progress`), which log lines print above;
    // with -q there is nothing to show.
    let live = tty && format == LogFormat::Auto && !quiet;
    // The step list says what the info lines would; -v brings them back.
    let steps = live && steps;
    let default = match (quiet || (steps && verbose == 0), verbose) {
        (true, _) => "warn",
        (false, 0) => "info",
        (false, 1) => "kiln=debug,info",
        (false, _) => "kiln=trace,debug",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    // https://no-color.org: any non-empty value.
    let color = std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    if live {
        crate::progress::enable_terminal();
    }
    if steps {
        crate::progress::steps::enable(color, verbose > 0);
    }
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    let stderr = || crate::progress::StderrWriter;
    match (format, tty) {
        (LogFormat::Json, _) => builder
            .with_writer(stderr)
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .init(),
        // In the step view nothing wraps: log lines are wrapped to the width by kiln.
        (LogFormat::Auto, true) if steps => builder
            .with_writer(|| crate::progress::steps::WrappingWriter)
            .compact()
            .without_time()
            .with_target(false)
            .with_ansi(color)
            .init(),
        (LogFormat::Auto, true) => builder
            .with_writer(stderr)
            .compact()
            .without_time()
            .with_target(false)
            .with_ansi(color)
            .init(),
        _ => builder
            .with_writer(stderr)
            .with_ansi(false)
            .with_target(false)
            .init(),
    }
}
