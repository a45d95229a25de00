//! Progress of long steps (downloads, a dependency install, blob uploads) as log lines: while
//! a step runs, a [`Ticker`] logs how far it got every [`PERIOD`] — the same lines in every
//! log format (the compact terminal view, plain lines, JSON with `--log-format json`), and
//! never on stdout. A step shorter than the period logs nothing more than before.

use std::time::Duration;

/// How often a running step reports.
pub const PERIOD: Duration = Duration::from_secs(5);

/// Calls `report` with the time elapsed every `period` until dropped. Needs a Tokio runtime.
#[must_use = "the ticker stops when dropped"]
pub struct Ticker(tokio::task::JoinHandle<()>);

impl Ticker {
    /// Starts ticking; the first report comes after one `period`.
    pub fn start(period: Duration, mut report: impl FnMut(Duration) + Send + 'static) -> Ticker {
        let start = tokio::time::Instant::now();
        Ticker(tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(start + period, period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                report(start.elapsed());
            }
        }))
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// `n` bytes in MB with one decimal, for progress lines.
pub fn megabytes(n: u64) -> String {
    format!("{:.1} MB", n as f64 / 1e6)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[tokio::test]
    async fn a_ticker_reports_every_period_while_it_lives_and_never_after() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let period = Duration::from_millis(40);
        let ticker = Ticker::start(period, move |elapsed| {
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
    }
}
