//! The controller's Prometheus metrics, in the text exposition format: reconciles by result,
//! errors by kind, the build queue's depth, builds running, build and reconcile durations.
//! Plain atomics and a mutex-guarded histogram: no client library needed for six series.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

/// Histogram bucket bounds for reconcile durations, in seconds.
const RECONCILE_BUCKETS: [f64; 8] = [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0];
/// Histogram bucket bounds for build durations, in seconds.
const BUILD_BUCKETS: [f64; 8] = [1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0];

/// A cumulative histogram.
struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    fn observe(&mut self, seconds: f64) {
        for (i, bound) in self.bounds.iter().enumerate() {
            if seconds <= *bound {
                self.counts[i] += 1;
            }
        }
        self.sum += seconds;
        self.count += 1;
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (bound, count) in self.bounds.iter().zip(&self.counts) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {count}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum {}\n{name}_count {}", self.sum, self.count);
    }
}

/// The metrics.
pub struct Metrics {
    reconciles: Mutex<BTreeMap<&'static str, u64>>,
    errors: Mutex<BTreeMap<&'static str, u64>>,
    queued: AtomicI64,
    builds_started: AtomicU64,
    leading: AtomicBool,
    reconcile_seconds: Mutex<Histogram>,
    build_seconds: Mutex<Histogram>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            reconciles: Mutex::default(),
            errors: Mutex::default(),
            queued: AtomicI64::new(0),
            builds_started: AtomicU64::new(0),
            leading: AtomicBool::new(false),
            reconcile_seconds: Mutex::new(Histogram::new(&RECONCILE_BUCKETS)),
            build_seconds: Mutex::new(Histogram::new(&BUILD_BUCKETS)),
        }
    }
}

fn bump(map: &Mutex<BTreeMap<&'static str, u64>>, label: &'static str) {
    let mut map = map.lock().unwrap_or_else(|e| e.into_inner());
    *map.entry(label).or_default() += 1;
}

impl Metrics {
    /// A reconcile ended: `ok` or `error`, after `took`.
    pub fn reconciled(&self, result: &'static str, took: Duration) {
        bump(&self.reconciles, result);
        let mut h = self
            .reconcile_seconds
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        h.observe(took.as_secs_f64());
    }

    /// A reconcile failed with an error of kind `label`.
    pub fn error(&self, label: &'static str) {
        bump(&self.errors, label);
    }

    /// The number of Functions waiting for a build slot.
    pub fn set_queued(&self, n: usize) {
        self.queued
            .store(i64::try_from(n).unwrap_or(i64::MAX), Ordering::Relaxed);
    }

    /// Whether this replica leads (reconciles) now.
    pub fn set_leading(&self, leading: bool) {
        self.leading.store(leading, Ordering::Relaxed);
    }

    /// Whether this replica leads now.
    pub fn leading(&self) -> bool {
        self.leading.load(Ordering::Relaxed)
    }

    /// A build Job was created.
    pub fn build_started(&self) {
        self.builds_started.fetch_add(1, Ordering::Relaxed);
    }

    /// A build Job ended after `took`.
    pub fn build_finished(&self, took: Duration) {
        let mut h = self.build_seconds.lock().unwrap_or_else(|e| e.into_inner());
        h.observe(took.as_secs_f64());
    }

    /// The metrics in Prometheus' text format; `running` is the number of build Jobs running.
    pub fn render(&self, running: usize) -> String {
        let mut out = String::new();
        let counter = |out: &mut String,
                       name: &str,
                       help: &str,
                       label: &str,
                       map: &Mutex<BTreeMap<&'static str, u64>>| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            let map = map.lock().unwrap_or_else(|e| e.into_inner());
            for (value, count) in map.iter() {
                let _ = writeln!(out, "{name}{{{label}=\"{value}\"}} {count}");
            }
        };
        counter(
            &mut out,
            "kiln_reconciles_total",
            "Function reconciles by result.",
            "result",
            &self.reconciles,
        );
        counter(
            &mut out,
            "kiln_reconcile_errors_total",
            "Failed reconciles by error kind.",
            "error",
            &self.errors,
        );
        let _ = writeln!(
            out,
            "# HELP kiln_build_queue_depth Functions waiting for a build slot.\n# TYPE \
                kiln_build_queue_depth gauge\nkiln_build_queue_depth {}",
            self.queued.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP kiln_leader 1 while this replica leads (reconciles), 0 on a standby.\n# TYPE \
                kiln_leader gauge\nkiln_leader {}",
            u8::from(self.leading())
        );
        let _ = writeln!(
            out,
            "# HELP kiln_builds_running Build Jobs running.\n# TYPE kiln_builds_running \
                gauge\nkiln_builds_running {running}"
        );
        let _ = writeln!(
            out,
            "# HELP kiln_builds_started_total Build Jobs created.\n# TYPE \
                kiln_builds_started_total counter\nkiln_builds_started_total {}",
            self.builds_started.load(Ordering::Relaxed)
        );
        self.reconcile_seconds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .render(
                &mut out,
                "kiln_reconcile_duration_seconds",
                "Time per reconcile.",
            );
        self.build_seconds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .render(
                &mut out,
                "kiln_build_duration_seconds",
                "Time from a build Job's start to its end.",
            );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_render_in_the_prometheus_text_format() {
        let m = Metrics::default();
        m.reconciled("ok", Duration::from_millis(3));
        m.reconciled("ok", Duration::from_secs(2));
        m.error("kube");
        m.set_queued(7);
        m.set_leading(true);
        m.build_finished(Duration::from_secs(12));
        let text = m.render(5);
        assert!(
            text.contains("kiln_reconciles_total{result=\"ok\"} 2"),
            "{text}"
        );
        assert!(text.contains("kiln_reconcile_errors_total{error=\"kube\"} 1"));
        assert!(text.contains("kiln_build_queue_depth 7"));
        assert!(text.contains("kiln_builds_running 5"));
        assert!(text.contains("kiln_leader 1"));
        assert!(text.contains("kiln_reconcile_duration_seconds_bucket{le=\"0.005\"} 1"));
        assert!(text.contains("kiln_reconcile_duration_seconds_count 2"));
        assert!(text.contains("kiln_build_duration_seconds_bucket{le=\"30\"} 1"));
    }
}
