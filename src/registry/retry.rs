//! Retry policy: capped exponential backoff with jitter, applied per request and only to
//! retryable errors ([`Error::is_retryable`]).

use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tracing::warn;

use super::error::Result;

/// How often and how patiently a failed request is repeated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries after the first attempt (0 disables retrying).
    pub max_retries: u32,
    /// Delay before the first retry; doubled for each further one.
    pub base_delay: Duration,
    /// Upper bound of any single delay.
    pub max_delay: Duration,
    /// Upper bound of a wait a registry asks for with `Retry-After`; a longer ask is taken
    /// as this, so a build finishes or fails in bounded time.
    pub max_retry_after: Duration,
}

impl Default for RetryPolicy {
    /// 8 retries, 200 ms base, 5 s cap (at most about 21 s of waiting per request), and
    /// `Retry-After` honoured up to 30 s. With one request in five failing, a build of ~16
    /// requests then fails about once in 10⁵ builds (with 5 retries, once in 10³).
    fn default() -> Self {
        RetryPolicy {
            max_retries: 8,
            base_delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(5),
            max_retry_after: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// Never retry.
    pub fn none() -> RetryPolicy {
        RetryPolicy {
            max_retries: 0,
            base_delay: Duration::ZERO,
            max_delay: Duration::ZERO,
            max_retry_after: Duration::ZERO,
        }
    }

    /// The delay before retry number `retry` (0-based): `min(cap, base * 2^retry)`, of which
    /// the upper half is jittered so that parallel uploads do not retry in lockstep.
    pub fn delay(&self, retry: u32) -> Duration {
        let exp = self
            .base_delay
            .saturating_mul(1u32.checked_shl(retry).unwrap_or(u32::MAX));
        let capped = exp.min(self.max_delay);
        let half = capped / 2;
        half + half.mul_f64(jitter(retry))
    }
}

/// Runs `op` until it succeeds, fails with a non-retryable error, or the retries are used up.
/// `what` names the operation in the warning logged before each retry. The wait before a
/// retry is the backoff delay or the registry's `Retry-After` (capped), whichever is longer.
///
/// Retries are not nested: what `op` does inside (a probe, a token fetch) is tried once per
/// attempt, so a failing registry sees `max_retries + 1` attempts, not their product.
pub(crate) async fn retry<T, F, Fut>(policy: &RetryPolicy, what: &str, mut op: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let mut retries = 0;
    loop {
        match op().await {
            Err(err) if err.is_retryable() && retries < policy.max_retries => {
                let asked = err.retry_after().map(|d| d.min(policy.max_retry_after));
                let delay = policy.delay(retries).max(asked.unwrap_or_default());
                retries += 1;
                warn!(operation = what, error = %err, retry = retries, ?delay, "retrying");
                tokio::time::sleep(delay).await;
            }
            other => return other,
        }
    }
}

/// A number in [0, 1) derived from the clock (splitmix64 of the nanoseconds and the attempt):
/// good enough to spread retries, no random-number crate needed.
fn jitter(retry: u32) -> f64 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let mut z = (nanos as u64) ^ (u64::from(retry) << 32) ^ 0x9e37_79b9_7f4a_7c15;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::registry::error::Error;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn server_error() -> Error {
        Error::Status {
            method: reqwest::Method::GET,
            url: "u".into(),
            status: 503,
            errors: vec![],
            retry_after: None,
        }
    }

    #[test]
    fn delays_grow_exponentially_within_jitter_and_are_capped() {
        let p = RetryPolicy::default();
        for retry in 0..10 {
            let full = (p.base_delay * 2u32.pow(retry)).min(p.max_delay);
            let d = p.delay(retry);
            assert!(
                d >= full / 2 && d <= full,
                "retry {retry}: {d:?} vs {full:?}"
            );
        }
        assert!(p.delay(40) <= p.max_delay);
        assert_eq!(RetryPolicy::none().delay(3), Duration::ZERO);
    }

    #[tokio::test]
    async fn retryable_errors_are_retried_up_to_the_limit() {
        let calls = AtomicU32::new(0);
        let policy = RetryPolicy {
            max_retries: 2,
            ..RetryPolicy::none()
        };
        let out: Result<()> = retry(&policy, "t", || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(server_error())
        })
        .await;
        assert!(out.is_err());
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn non_retryable_errors_fail_at_once_and_success_stops() {
        let calls = AtomicU32::new(0);
        let policy = RetryPolicy {
            max_retries: 5,
            ..RetryPolicy::none()
        };
        let out: Result<()> = retry(&policy, "t", || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(Error::Protocol {
                method: reqwest::Method::GET,
                url: "u".into(),
                problem: "p",
            })
        })
        .await;
        assert!(out.is_err());
        assert_eq!(calls.load(Ordering::SeqCst), 1);

        let calls = AtomicU32::new(0);
        let out = retry(&policy, "t", || async {
            if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                Err(server_error())
            } else {
                Ok(7)
            }
        })
        .await;
        assert_eq!(out.unwrap(), 7);
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }
}
