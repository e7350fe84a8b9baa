//! Client-side retries, as the Go SDK makes them (CLIENT-COMPAT §5): a fixed number of
//! attempts in total, full-jitter exponential backoff between them, and the server's
//! `Retry-After` honoured when it sends one.
//!
//! Only retryable failures are retried ([`Error::is_retryable`]: transport failures, `408`,
//! `429`, `5xx`). A produce retried after an uncertain failure may store the message twice,
//! which at-least-once delivery allows; nothing acknowledged is ever dropped.

use std::future::Future;
use std::time::Duration;

use crate::Error;

/// Longest wait a `Retry-After` may impose on one retry.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(30);

/// How often and how patiently to retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    /// Attempts in total (1: no retry).
    pub attempts: u32,
    /// The first backoff bound; it doubles per attempt.
    pub base: Duration,
    /// The largest backoff bound.
    pub max: Duration,
}

impl Default for Retry {
    /// The SDK's defaults: 4 attempts, 50 ms base, 5 s cap.
    fn default() -> Self {
        Retry {
            attempts: 4,
            base: Duration::from_millis(50),
            max: Duration::from_secs(5),
        }
    }
}

impl Retry {
    /// No retries.
    pub fn none() -> Retry {
        Retry {
            attempts: 1,
            ..Retry::default()
        }
    }

    /// The wait before retry number `retry` (0 for the first) after `err`: its
    /// `Retry-After` (at most [`MAX_RETRY_AFTER`]) when it carries one, else
    /// `jitter` × min(base · 2^retry, max), with `jitter` in [0, 1).
    pub fn delay(&self, retry: u32, err: &Error, jitter: f64) -> Duration {
        if let Some(s) = err.retry_after() {
            return Duration::from_secs(s).min(MAX_RETRY_AFTER);
        }
        let bound = self
            .base
            .checked_mul(1u32.checked_shl(retry.min(31)).unwrap_or(u32::MAX))
            .unwrap_or(self.max)
            .min(self.max);
        bound.mul_f64(jitter.clamp(0.0, 1.0))
    }

    /// Runs `op` until it succeeds, fails with an error that is not retryable, or the
    /// attempts are used up; returns the last result. `on_retry` sees each retried error
    /// and the wait before the next attempt.
    pub async fn run<T, F, Fut>(
        &self,
        mut op: F,
        mut on_retry: impl FnMut(&Error, Duration),
    ) -> Result<T, Error>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, Error>>,
    {
        let mut retry = 0;
        loop {
            match op().await {
                Ok(v) => return Ok(v),
                Err(e) if e.is_retryable() && retry + 1 < self.attempts => {
                    let wait = self.delay(retry, &e, rand::random::<f64>());
                    on_retry(&e, wait);
                    tokio::time::sleep(wait).await;
                    retry += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HttpError;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn api(status: u16, retry_after: Option<&str>) -> Error {
        Error::Api(HttpError::from_body(
            status,
            b"{\"error\":\"x\"}",
            retry_after,
        ))
    }

    fn refused() -> Error {
        Error::Transport {
            message: "cannot connect: Connection refused".into(),
            timeout: false,
            connect: true,
        }
    }

    #[test]
    fn backoff_is_full_jitter_under_a_doubling_capped_bound() {
        let r = Retry::default();
        let e = refused();
        assert_eq!(r.delay(0, &e, 0.0), Duration::ZERO);
        assert_eq!(r.delay(0, &e, 0.5), Duration::from_millis(25));
        assert_eq!(r.delay(3, &e, 0.5), Duration::from_millis(200));
        // Capped at max, however many retries.
        assert_eq!(r.delay(10, &e, 0.5), Duration::from_millis(2500));
        assert_eq!(
            r.delay(u32::MAX, &e, 0.999),
            Duration::from_secs(5).mul_f64(0.999)
        );
    }

    #[test]
    fn retry_after_is_honoured_up_to_a_bound() {
        let r = Retry::default();
        assert_eq!(
            r.delay(0, &api(503, Some("2")), 0.0),
            Duration::from_secs(2)
        );
        assert_eq!(r.delay(0, &api(503, Some("86400")), 0.0), MAX_RETRY_AFTER);
    }

    /// The default attempts with millisecond waits.
    fn quick() -> Retry {
        Retry {
            base: Duration::from_millis(1),
            max: Duration::from_millis(2),
            ..Retry::default()
        }
    }

    #[tokio::test]
    async fn retries_retryable_failures_until_the_attempts_run_out() {
        let calls = AtomicU32::new(0);
        let mut seen = Vec::new();
        let r = quick()
            .run(
                || async {
                    calls.fetch_add(1, Ordering::SeqCst);
                    Err::<(), _>(refused())
                },
                |e, _| seen.push(e.to_string()),
            )
            .await;
        assert!(r.unwrap_err().is_transport());
        assert_eq!(calls.load(Ordering::SeqCst), 4);
        assert_eq!(seen.len(), 3);
    }

    #[tokio::test]
    async fn stops_at_success_or_at_an_error_that_is_not_retryable() {
        let calls = AtomicU32::new(0);
        let ok = quick()
            .run(
                || async {
                    match calls.fetch_add(1, Ordering::SeqCst) {
                        0 => Err(api(503, None)),
                        _ => Ok(7),
                    }
                },
                |_, _| {},
            )
            .await;
        assert_eq!(ok.unwrap(), 7);
        assert_eq!(calls.load(Ordering::SeqCst), 2);

        calls.store(0, Ordering::SeqCst);
        let e = quick()
            .run(
                || async {
                    calls.fetch_add(1, Ordering::SeqCst);
                    Err::<(), _>(api(404, None))
                },
                |_, _| {},
            )
            .await;
        assert_eq!(e.unwrap_err().status(), Some(404));
        assert_eq!(calls.load(Ordering::SeqCst), 1);

        calls.store(0, Ordering::SeqCst);
        let _ = Retry::none()
            .run(
                || async {
                    calls.fetch_add(1, Ordering::SeqCst);
                    Err::<(), _>(refused())
                },
                |_, _| {},
            )
            .await;
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }
}
