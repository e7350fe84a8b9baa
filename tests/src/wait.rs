//! Waiting on conditions. Tests never sleep to "give the server time": they poll a
//! condition with [`eventually`]. Bare sleeps are reserved for behaviour that is defined by
//! elapsed time (a visibility timeout running out), and then with explicit margins.

use std::future::Future;
use std::time::{Duration, Instant};

/// Polls `f` every `interval` until it returns `Ok`, for at most `timeout`; returns the
/// value, or the last error (with how long and how often it was tried).
pub async fn try_eventually<T, F, Fut>(
    timeout: Duration,
    interval: Duration,
    mut f: F,
) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<T>>,
{
    let start = Instant::now();
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) => {
                if start.elapsed() >= timeout {
                    return Err(e.context(format!(
                        "condition not met within {timeout:?} ({attempts} attempts)"
                    )));
                }
            }
        }
        tokio::time::sleep(interval).await;
    }
}

/// Like [`try_eventually`], but panics with the last error when time runs out.
pub async fn eventually<T, F, Fut>(timeout: Duration, interval: Duration, f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<T>>,
{
    match try_eventually(timeout, interval, f).await {
        Ok(v) => v,
        Err(e) => panic!("{e:#}"),
    }
}
