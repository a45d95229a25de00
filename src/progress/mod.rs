//! Progress of long steps (downloads, a dependency install, blob uploads). On a terminal
//! showing the compact view, each running step is a live line at the bottom of stderr (an
//! indicatif bar for bytes, a spinner with the install's last output line), and log lines
//! are printed above it. Elsewhere (plain lines, JSON with `--log-format json`, a terminal
//! with `-q`) a [`Ticker`] logs how far the step got every [`PERIOD`] instead. Never on
//! stdout; a step shorter than the period logs nothing more than before.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

pub mod steps;

/// How often a running step reports in log lines.
pub const PERIOD: Duration = Duration::from_secs(5);
/// How often a live line is brought up to date.
const REDRAW: Duration = Duration::from_millis(100);

/// The live lines, when stderr is a terminal showing the compact view ([`enable_terminal`]).
static TERMINAL: OnceLock<MultiProgress> = OnceLock::new();

/// Shows running steps as live lines on stderr from now on; called once by the tracing setup
/// when stderr is a terminal. Log lines must then go through [`StderrWriter`].
pub fn enable_terminal() {
    TERMINAL.get_or_init(|| MultiProgress::with_draw_target(ProgressDrawTarget::stderr()));
}

/// stderr for log lines: above the live lines while any are shown.
#[derive(Clone, Copy, Debug, Default)]
pub struct StderrWriter;

impl Write for StderrWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match TERMINAL.get() {
            Some(multi) => multi.suspend(|| std::io::stderr().write_all(buf))?,
            None => std::io::stderr().write_all(buf)?,
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// What a step's live line shows.
pub enum Show {
    /// A label and a message that changes (the install's last line).
    Message {
        /// What the step is.
        label: String,
        /// The current message.
        message: Box<dyn Fn() -> String + Send + Sync>,
    },
    /// A label and bytes done, of a total when known.
    Bytes {
        /// What the step is.
        label: String,
        /// Bytes done and the total.
        done: Box<dyn Fn() -> (u64, Option<u64>) + Send + Sync>,
    },
}

/// A running step's progress: a live line on a terminal, else `log` every `period`. Needs a
/// Tokio runtime; stops (and clears its line) when dropped.
#[must_use = "the ticker stops when dropped"]
pub struct Ticker {
    task: tokio::task::JoinHandle<()>,
    bar: Option<ProgressBar>,
    /// The step whose line shows this ticker's progress (see [`steps`]).
    step: Option<(u64, ProgressBar)>,
}

impl Ticker {
    /// Starts reporting; the first log line comes after one `period`.
    pub fn start(
        period: Duration,
        show: Show,
        log: impl FnMut(Duration) + Send + 'static,
    ) -> Ticker {
        match (TERMINAL.get(), steps::attach()) {
            (Some(_), Some(step)) => on_step(step, show),
            (Some(multi), None) => live(multi, show),
            (None, _) => Ticker {
                task: every(period, log),
                bar: None,
                step: None,
            },
        }
    }
}

impl Ticker {
    /// [`Ticker::start`] for a step that counts its bytes in `done`, of `total` when known:
    /// `log` gets the time elapsed and the bytes done every [`PERIOD`].
    pub fn bytes(
        label: String,
        done: Arc<AtomicU64>,
        total: Option<u64>,
        mut log: impl FnMut(Duration, u64) + Send + 'static,
    ) -> Ticker {
        let read = done.clone();
        let show = Show::Bytes {
            label,
            done: Box::new(move || (read.load(Ordering::Relaxed), total)),
        };
        Ticker::start(PERIOD, show, move |elapsed| {
            log(elapsed, done.load(Ordering::Relaxed));
        })
    }
}

/// Calls `report` with the time elapsed every `period`.
fn every(
    period: Duration,
    mut report: impl FnMut(Duration) + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    let start = tokio::time::Instant::now();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval_at(start + period, period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            report(start.elapsed());
        }
    })
}

fn style(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_spinner())
}

/// Shows `show` on a running step's line: its label stays, the bytes or the message follow.
fn on_step((id, bar): (u64, ProgressBar), show: Show) -> Ticker {
    if let Show::Bytes { .. } = show {
        bar.set_style(style(
            "{spinner} {prefix:15} [{bar:24}] {bytes}/{total_bytes} {elapsed:>4}",
        ));
    }
    Ticker {
        task: every(REDRAW, update(bar.clone(), show)),
        bar: None,
        step: Some((id, bar)),
    }
}

/// Brings `bar` up to date with `show`.
fn update(bar: ProgressBar, show: Show) -> impl FnMut(Duration) + Send + 'static {
    move |_| match &show {
        Show::Message { message, .. } => bar.set_message(message()),
        Show::Bytes { done, .. } => {
            let (done, total) = done();
            match total {
                Some(total) => bar.set_length(total.max(done)),
                None => bar.set_length(done),
            }
            bar.set_position(done);
        }
    }
}

fn live(multi: &MultiProgress, show: Show) -> Ticker {
    // Into the live lines before anything is set: a new bar draws on stderr by itself, and
    // that first frame would stay behind as a line of its own (the stale spinner lines).
    let bar = multi.add(ProgressBar::hidden());
    match &show {
        Show::Message { label, .. } => {
            bar.set_style(style("{spinner} {prefix} {elapsed} {wide_msg}"));
            bar.set_prefix(label.clone());
        }
        Show::Bytes { label, .. } => {
            bar.set_style(style(
                "{spinner} {prefix} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {elapsed}",
            ));
            bar.set_prefix(label.clone());
        }
    }
    bar.enable_steady_tick(REDRAW);
    Ticker {
        task: every(REDRAW, update(bar.clone(), show)),
        bar: Some(bar),
        step: None,
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.task.abort();
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        if let Some((id, bar)) = &self.step {
            steps::detach(*id, bar);
        }
    }
}

/// A reader that adds what it reads to a counter a [`Show::Bytes`] can read.
pub struct Counted<R> {
    inner: R,
    count: Arc<AtomicU64>,
}

impl<R> Counted<R> {
    /// Counts what is read from `inner` into `count`.
    pub fn new(inner: R, count: Arc<AtomicU64>) -> Counted<R> {
        Counted { inner, count }
    }
}

impl<R: std::io::Read> std::io::Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// `n` bytes, readably: `512 B`, `1.2 kB`, `3.4 MB`, `1.1 GB`.
pub fn bytes(n: u64) -> String {
    match n {
        n if n < 1000 => format!("{n} B"),
        n if n < 1_000_000 => format!("{:.1} kB", n as f64 / 1e3),
        n if n < 1_000_000_000 => format!("{:.1} MB", n as f64 / 1e6),
        n => format!("{:.1} GB", n as f64 / 1e9),
    }
}

/// `n` bytes in MB with one decimal, for progress lines.
pub fn megabytes(n: u64) -> String {
    format!("{:.1} MB", n as f64 / 1e6)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[tokio::test]
    async fn a_ticker_reports_every_period_while_it_lives_and_never_after() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let period = Duration::from_millis(40);
        let show = Show::Message {
            label: "test".into(),
            message: Box::new(String::new),
        };
        let ticker = Ticker::start(period, show, move |elapsed| {
            log.lock().map(|mut l| l.push(elapsed)).ok();
        });
        tokio::time::sleep(Duration::from_millis(150)).await;
        drop(ticker);
        let reports = seen.lock().map(|l| l.clone()).unwrap_or_default();
        assert!(!reports.is_empty() && reports.len() <= 3, "{reports:?}");
        for (i, elapsed) in reports.iter().enumerate() {
            assert!(*elapsed >= period * (i as u32 + 1), "{reports:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            seen.lock().map(|l| l.len()).unwrap_or_default(),
            reports.len()
        );
        assert_eq!(megabytes(12_345_678), "12.3 MB");
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1_234), "1.2 kB");
        assert_eq!(bytes(12_345_678), "12.3 MB");
    }
}
