//! `kiln build --termination-log PATH`: what Kubernetes shows as a build container's
//! termination message (and the controller copies into the Function's BuildReady condition).
//! On success the stdout line; on failure the error chain as `main` prints it, cut to the
//! kubelet's 4 KiB keeping its beginning (what failed) and its end (the install's last lines).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::Context;

use super::Failure;

/// The kubelet reads at most this many bytes of a termination message.
pub const LIMIT: usize = 4096;
const CUT: &str = "\n[…]\n";

/// The message for `outcome`, at most [`LIMIT`] bytes.
pub fn message(outcome: &Result<String, Failure>) -> Option<String> {
    let text = match outcome {
        Ok(line) => line.clone(),
        Err(Failure::Usage(e) | Failure::Build(e)) => format!("{e:#}"),
        Err(Failure::Exit(_)) => return None,
    };
    Some(truncate(&text, LIMIT))
}

/// Writes the message for `outcome` to `path`. Failing to record a success fails the build
/// (the controller could not learn the digest); failing to record a failure only warns.
pub(super) fn write(path: &Path, outcome: Result<String, Failure>) -> Result<String, Failure> {
    let Some(text) = message(&outcome) else {
        return outcome;
    };
    let written = std::fs::write(path, text)
        .with_context(|| format!("writing the termination log {}", path.display()));
    match (outcome, written) {
        (Ok(_), Err(e)) => Err(Failure::Build(e)),
        (Err(failure), Err(e)) => {
            tracing::warn!("{e:#}");
            Err(failure)
        }
        (outcome, Ok(())) => outcome,
    }
}

/// Records a command-line parse error in the termination log named on the command line, if
/// any, so that a build Job whose flags this kiln does not know still says why it failed.
pub fn record_parse_error(args: &[OsString], error: &clap::Error) {
    if !error.use_stderr() {
        return; // --help, --version
    }
    if let Some(path) = termination_log_arg(args) {
        let text = truncate(error.to_string().trim_end(), LIMIT);
        // Best effort: clap prints the error and exits next.
        let _ = std::fs::write(path, text);
    }
}

fn termination_log_arg(args: &[OsString]) -> Option<PathBuf> {
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        let arg = arg.to_str()?;
        if arg == "--" {
            return None;
        }
        if arg == "--termination-log" {
            return iter.next().map(PathBuf::from);
        }
        if let Some(value) = arg.strip_prefix("--termination-log=") {
            return Some(PathBuf::from(value));
        }
    }
    None
}

/// `text` cut to at most `limit` bytes on character boundaries: the first line (at most half
/// the room), a cut mark, and as much of the end as fits, starting at a line when one begins
/// near the cut.
pub fn truncate(text: &str, limit: usize) -> String {
    if text.len() <= limit {
        return text.to_string();
    }
    if limit <= CUT.len() {
        return text[..floor_boundary(text, limit)].to_string();
    }
    let room = limit - CUT.len();
    let first_line = text.find('\n').unwrap_or(text.len());
    let head = floor_boundary(text, first_line.min(room / 2));
    let mut tail = ceil_boundary(text, text.len() - (room - head));
    // Start the tail at a whole line if one starts within the first tenth of it.
    if let Some(nl) = text[tail..].find('\n')
        && nl < (room - head) / 10
    {
        tail += nl + 1;
    }
    format!("{}{CUT}{}", &text[..head], &text[tail..])
}

fn floor_boundary(text: &str, mut i: usize) -> usize {
    while !text.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn ceil_boundary(text: &str, mut i: usize) -> usize {
    while !text.is_char_boundary(i) {
        i += 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_messages_are_kept_whole() {
        assert_eq!(truncate("reg/x@sha256:abc", LIMIT), "reg/x@sha256:abc");
    }

    #[test]
    fn long_messages_keep_what_failed_and_the_last_lines_of_output() {
        let head =
            "installing dependencies: `npm ci` failed (exit status: 1); last lines of its output:";
        let mut text = head.to_string();
        for i in 0..500 {
            text.push_str(&format!("\nnpm error line {i} ü"));
        }
        text.push_str("\nnpm error 404 Not Found - kiln-no-such-package");
        let cut = truncate(&text, LIMIT);
        assert!(cut.len() <= LIMIT, "{}", cut.len());
        assert!(cut.starts_with(head), "{cut}");
        assert!(cut.ends_with("kiln-no-such-package"), "{cut}");
        assert!(
            cut.contains("\n[…]\nnpm error line"),
            "the tail starts at a line: {cut}"
        );
        assert!(!cut.contains("line 0 "), "the middle is cut");
    }

    #[test]
    fn cutting_never_splits_a_character() {
        let text = "é".repeat(5000);
        for limit in [4096, 4097, 100, 3] {
            let cut = truncate(&text, limit);
            assert!(cut.len() <= limit, "{limit}: {}", cut.len());
        }
    }

    #[test]
    fn the_termination_log_flag_is_found_in_either_spelling() {
        let args = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
        assert_eq!(
            termination_log_arg(&args(&["kiln", "build", "--termination-log", "/dev/t"])),
            Some(PathBuf::from("/dev/t"))
        );
        assert_eq!(
            termination_log_arg(&args(&["kiln", "build", "--termination-log=/t"])),
            Some(PathBuf::from("/t"))
        );
        assert_eq!(
            termination_log_arg(&args(&["kiln", "build", "--", "--termination-log", "x"])),
            None
        );
    }
}
