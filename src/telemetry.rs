//! Tracing setup, called once from `main`: a compact human view on a terminal (with live
//! progress lines for long steps), plain lines with timestamps otherwise, or JSON lines; all
//! on stderr, filtered by `RUST_LOG` or -v/-q.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::cli::{GlobalArgs, LogFormat};

/// Installs the global subscriber.
pub fn init(args: &GlobalArgs) {
    let default = match (args.quiet, args.verbose) {
        (true, _) => "warn",
        (false, 0) => "info",
        (false, 1) => "kiln=debug,info",
        (false, _) => "kiln=trace,debug",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let tty = std::io::stderr().is_terminal();
    // On a terminal, long steps are live lines (`progress`), which log lines print above;
    // with -q there is nothing to show.
    let live = tty && args.log_format == LogFormat::Auto && !args.quiet;
    if live {
        crate::progress::enable_terminal();
    }
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| crate::progress::StderrWriter);
    match (args.log_format, tty) {
        (LogFormat::Json, _) => builder
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .init(),
        (LogFormat::Auto, true) => builder.compact().without_time().with_target(false).init(),
        _ => builder.with_ansi(false).with_target(false).init(),
    }
}
