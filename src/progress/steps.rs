//! `kiln build`'s human view on a terminal: one line per step. A running step is a live line
//! (a spinner, what it is doing, its time); a finished one is printed once, for good, as
//! `✓ label  detail  time`, cut to the terminal's width. A [`super::Ticker`] started while a
//! step runs shows its progress (bytes, the installer's last line) on that step's line rather
//! than on one of its own. Everywhere else (plain or JSON lines, `-q`, `-v`'s detail) steps
//! show nothing: the log lines say the same.

use std::fmt::Display;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

/// Set once by [`enable`]: steps are shown.
static STEPS: OnceLock<Steps> = OnceLock::new();

struct Steps {
    /// Colour on stderr (a terminal, and no `NO_COLOR`).
    color: bool,
    /// `-v`: the summary has the build key too.
    verbose: bool,
    /// The running steps' lines, innermost last, each with whether a ticker shows on it.
    running: Mutex<Vec<Running>>,
    next: AtomicU64,
}

struct Running {
    id: u64,
    bar: ProgressBar,
    ticking: bool,
}

/// Shows steps from now on; called once by the tracing setup, after
/// [`super::enable_terminal`], for `kiln build` on a terminal.
pub fn enable(color: bool, verbose: bool) {
    if super::TERMINAL.get().is_some() {
        STEPS.get_or_init(|| Steps {
            color,
            verbose,
            running: Mutex::new(Vec::new()),
            next: AtomicU64::new(0),
        });
    }
}

/// Whether steps are shown (the human view).
pub fn enabled() -> bool {
    STEPS.get().is_some()
}

/// Whether steps are shown with `-v`.
pub fn verbose() -> bool {
    STEPS.get().is_some_and(|s| s.verbose)
}

/// A step of the build, shown while it runs and once it is [`Step::done`]; dropped without
/// that (it failed: the error follows), its line goes.
#[must_use = "a step's line goes when it is dropped"]
pub struct Step {
    live: Option<(u64, ProgressBar)>,
    label: &'static str,
    started: Instant,
}

/// The width a step's label is padded to.
const LABEL: usize = 15;

fn spinner_style() -> ProgressStyle {
    ProgressStyle::with_template("{spinner} {prefix:15} {wide_msg} {elapsed:>4}")
        .unwrap_or_else(|_| ProgressStyle::default_spinner())
}

impl Step {
    /// Starts the step `label` (at most 15 characters).
    pub fn start(label: &'static str) -> Step {
        let live = STEPS
            .get()
            .zip(super::TERMINAL.get())
            .map(|(steps, multi)| {
                // Added before it is styled: a bar draws on stderr by itself until it is.
                let bar = multi.add(ProgressBar::hidden());
                bar.set_style(spinner_style());
                bar.set_prefix(label);
                bar.enable_steady_tick(super::REDRAW);
                let id = steps.next.fetch_add(1, Ordering::Relaxed);
                if let Ok(mut running) = steps.running.lock() {
                    running.push(Running {
                        id,
                        bar: bar.clone(),
                        ticking: false,
                    });
                }
                (id, bar)
            });
        Step {
            live,
            label,
            started: Instant::now(),
        }
    }

    /// Ends the step: its live line becomes `✓ label  detail  time`.
    pub fn done(mut self, detail: impl Display) {
        if self.live.is_some() {
            self.end();
            let steps = STEPS.get();
            let mark = match steps.is_some_and(|s| s.color) {
                true => "\x1b[32m✓\x1b[0m",
                false => "✓",
            };
            let line = line(
                mark,
                self.label,
                &detail.to_string(),
                self.started.elapsed(),
                width(),
            );
            print(&line);
        }
    }

    fn end(&mut self) {
        if let Some((id, bar)) = self.live.take() {
            if let Some(mut running) = STEPS.get().and_then(|s| s.running.lock().ok()) {
                running.retain(|r| r.id != id);
            }
            bar.finish_and_clear();
        }
    }
}

impl Drop for Step {
    fn drop(&mut self) {
        self.end();
    }
}

/// The innermost running step's line for a ticker to show its progress on, unless one does
/// already; give it back with [`detach`].
pub(super) fn attach() -> Option<(u64, ProgressBar)> {
    let mut running = STEPS.get()?.running.lock().ok()?;
    let innermost = running.last_mut()?;
    if innermost.ticking {
        return None;
    }
    innermost.ticking = true;
    Some((innermost.id, innermost.bar.clone()))
}

/// Gives a step's line back from a ticker: its spinner again, without the ticker's message.
pub(super) fn detach(id: u64, bar: &ProgressBar) {
    if let Some(mut running) = STEPS.get().and_then(|s| s.running.lock().ok())
        && let Some(r) = running.iter_mut().find(|r| r.id == id)
    {
        r.ticking = false;
    }
    bar.set_style(spinner_style());
    bar.set_message("");
}

/// Prints the build's summary below the steps: `name  value` rows, each cut to the width.
pub fn summary(rows: &[(&str, String)]) {
    if !enabled() {
        return;
    }
    let width = width();
    for (name, value) in rows {
        print(&fit(&format!("  {name:<7} {value}"), width));
    }
}

/// stderr for log lines in the step view: each line wrapped at spaces to the terminal's
/// width (continued indented), then printed above the live lines.
#[derive(Clone, Copy, Debug, Default)]
pub struct WrappingWriter;

impl std::io::Write for WrappingWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        let width = width();
        let wrapped: Vec<String> = text
            .trim_end_matches('\n')
            .lines()
            .map(|line| wrap(line, width))
            .collect();
        print(&wrapped.join("\n"));
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::Write::flush(&mut std::io::stderr())
    }
}

/// `line` broken at spaces into lines of at most `width` columns, each after the first
/// indented by two; colour codes take no columns. A word longer than a line is cut.
fn wrap(line: &str, width: usize) -> String {
    const INDENT: &str = "  ";
    let mut out = String::new();
    let mut used = 0;
    for (i, word) in line.split(' ').enumerate() {
        let w = console::measure_text_width(word);
        if i > 0 && used > INDENT.len() && used + 1 + w > width {
            out.push('\n');
            out.push_str(INDENT);
            used = INDENT.len();
        } else if i > 0 {
            out.push(' ');
            used += 1;
        }
        let room = width.saturating_sub(used).max(1);
        let word = if w > room {
            fit(word, room)
        } else {
            word.to_string()
        };
        used += console::measure_text_width(&word);
        out.push_str(&word);
    }
    out
}

/// Prints `line` on stderr, above the live lines while any are shown.
pub fn print(line: &str) {
    match super::TERMINAL.get() {
        Some(multi) => multi.suspend(|| eprintln!("{line}")),
        None => eprintln!("{line}"),
    }
}

/// The terminal's width in columns (80 when it cannot be told).
fn width() -> usize {
    match console::Term::stderr().size_checked() {
        Some((_, columns)) if columns > 0 => usize::from(columns),
        _ => 80,
    }
}

/// `mark label  detail` then `elapsed` at the right edge, within `width` columns: the detail
/// is cut (ending in `…`) where it would not fit.
fn line(mark: &str, label: &str, detail: &str, elapsed: Duration, width: usize) -> String {
    let time = duration(elapsed);
    let left = format!("{label:<LABEL$} {detail}");
    // The mark, a space before the text, and one before the time.
    let room = width.saturating_sub(console::measure_text_width(&time) + 3);
    let left = fit(&left, room);
    let pad = room.saturating_sub(console::measure_text_width(&left));
    format!("{mark} {left}{} {time}", " ".repeat(pad))
}

/// `text` cut to `width` columns, ending in `…` when cut.
fn fit(text: &str, width: usize) -> String {
    console::truncate_str(text, width, "…").into_owned()
}

/// A step's time: `12ms`, `1.2s`, `1m05s`.
pub fn duration(d: Duration) -> String {
    match d.as_millis() {
        ms if ms < 1000 => format!("{ms}ms"),
        ms if ms < 60_000 => format!("{:.1}s", ms as f64 / 1000.0),
        ms => format!("{}m{:02}s", ms / 60_000, ms / 1000 % 60),
    }
}

/// `sha256:` and the first 12 hex digits of `digest`, for lines that must fit a terminal.
pub fn short_digest(digest: &impl Display) -> String {
    let full = digest.to_string();
    match full.split_once(':') {
        Some((algorithm, hex)) if hex.len() > 12 => format!("{algorithm}:{}", &hex[..12]),
        _ => full,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_line_fits_its_width_with_the_time_at_the_right_edge() {
        let l = line(
            "✓",
            "resolve base",
            "node@sha256:0123456789ab",
            Duration::from_millis(12),
            60,
        );
        assert_eq!(console::measure_text_width(&l), 60, "{l:?}");
        assert!(
            l.starts_with("✓ resolve base    node@sha256:0123456789ab"),
            "{l:?}"
        );
        assert!(l.ends_with(" 12ms"), "{l:?}");
        let long = "x".repeat(200);
        let l = line("✓", "push", &long, Duration::from_secs(75), 80);
        assert_eq!(console::measure_text_width(&l), 80, "{l:?}");
        assert!(l.ends_with("… 1m15s"), "{l:?}");
        // Colour codes take no columns.
        let l = line(
            "\x1b[32m✓\x1b[0m",
            "push",
            "",
            Duration::from_millis(1500),
            40,
        );
        assert_eq!(console::measure_text_width(&l), 40, "{l:?}");
        assert!(l.ends_with(" 1.5s"), "{l:?}");
    }

    #[test]
    fn a_long_log_line_wraps_at_spaces_within_the_width() {
        let line = " WARN runtime nodejs20 is built as nodejs22 (Node.js 22): kiln has no \
                    nodejs20 runtime; set spec.runtime: nodejs22 to silence this";
        let wrapped = wrap(line, 40);
        for l in wrapped.lines() {
            assert!(console::measure_text_width(l) <= 40, "{wrapped}");
        }
        assert_eq!(wrapped.replace("\n  ", " "), line);
        // Colour codes take no columns; a word wider than the line is cut.
        let colored = format!("\x1b[33m WARN\x1b[0m {}", "x".repeat(50));
        for l in wrap(&colored, 20).lines() {
            assert!(console::measure_text_width(l) <= 20, "{l:?}");
        }
        assert_eq!(wrap("short", 40), "short");
    }

    #[test]
    fn digests_are_shortened_and_other_text_kept() {
        let d = format!("sha256:{}", "ab".repeat(32));
        assert_eq!(short_digest(&d), "sha256:abababababab");
        assert_eq!(short_digest(&"latest"), "latest");
    }
}
