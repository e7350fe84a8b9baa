//! `narad sub <topic> [--partition N] [--raw] [--no-ack]`: a queue consumer (long polls of
//! 10 s, prints each message, acks with retries; a `410` is reported, not retried).
//! `narad sub <topic> --peek [--partition N] [--from O]`: a read-only tail by replay.

use std::time::Duration;

use anyhow::bail;
use narad_api::{Client, Error, Message, Replay};
use tokio_util::sync::CancellationToken;

use crate::conn::{connect, ConnArgs};
use crate::output::{is_broken_pipe, write_message};

/// Long-poll wait of a queue consume.
pub const POLL_WAIT: Duration = Duration::from_secs(10);
/// Attempts of one ack before giving up on it.
const ACK_ATTEMPTS: u32 = 8;
/// Pause between peek rounds that found nothing.
const PEEK_IDLE: Duration = Duration::from_millis(500);
/// Messages read from one partition before moving to the next.
const PEEK_ROUND: usize = 100;

#[derive(Debug, clap::Args)]
pub struct SubArgs {
    /// Topic
    pub topic: String,
    /// Only this partition
    #[arg(long)]
    pub partition: Option<u32>,
    /// Print decoded payloads only, one per line
    #[arg(long)]
    pub raw: bool,
    /// Do not ack (messages are redelivered when their lease expires)
    #[arg(long, conflicts_with = "peek")]
    pub no_ack: bool,
    /// Read-only tail by replay: no lease, no ack, no effect on the queue
    #[arg(long)]
    pub peek: bool,
    /// With --peek: start at this offset instead of the high watermark
    #[arg(long, value_name = "O", requires = "peek")]
    pub from: Option<u64>,
    /// Exit after this many messages
    #[arg(long, short = 'n', value_name = "N")]
    pub count: Option<u64>,
    #[command(flatten)]
    pub conn: ConnArgs,
}

/// A token cancelled by Ctrl-C.
pub fn ctrl_c_token() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            t.cancel();
        }
    });
    token
}

/// Backoff for the n-th consecutive failure (0-based): 100 ms doubling to 5 s, or the
/// server's `Retry-After` (at most 30 s).
pub fn backoff(attempt: u32, err: Option<&Error>) -> Duration {
    if let Some(s) = err.and_then(Error::retry_after) {
        return Duration::from_secs(s.clamp(1, 30));
    }
    let ms = 100u64.saturating_mul(1 << attempt.min(6));
    Duration::from_millis(ms.min(5000))
}

/// Sleeps unless cancelled; false when cancelled.
async fn pause(d: Duration, stop: &CancellationToken) -> bool {
    tokio::select! {
        _ = stop.cancelled() => false,
        _ = tokio::time::sleep(d) => true,
    }
}

/// Acks with retries: 503/5xx/429 and transport errors are retried with backoff; anything
/// else (notably `410`, lease lost) is returned at once.
pub async fn ack_with_retry(
    client: &Client,
    m: &Message,
    stop: &CancellationToken,
) -> Result<(), Error> {
    let handle = m.receipt_handle.as_deref().unwrap_or_default();
    let mut attempt = 0;
    loop {
        match client.ack(&m.topic, handle).await {
            Ok(()) => return Ok(()),
            Err(e) if e.is_retryable() && attempt + 1 < ACK_ATTEMPTS => {
                if !pause(backoff(attempt, Some(&e)), stop).await {
                    return Err(e);
                }
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Runs `sub`.
pub async fn run(a: SubArgs) -> anyhow::Result<()> {
    let client = connect(&a.conn)?;
    let stop = ctrl_c_token();
    if a.peek {
        peek(&client, &a, &stop).await
    } else {
        queue(&client, &a, &stop).await
    }
}

async fn queue(client: &Client, a: &SubArgs, stop: &CancellationToken) -> anyhow::Result<()> {
    let mut failures = 0u32;
    let mut seen = 0u64;
    while a.count.is_none_or(|c| seen < c) {
        let polled = tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            r = client.consume(&a.topic, Some(POLL_WAIT), a.partition) => r,
        };
        let m = match polled {
            Ok(None) => {
                failures = 0;
                continue;
            }
            Ok(Some(m)) => {
                failures = 0;
                m
            }
            Err(e) if e.is_retryable() => {
                if failures == 0 {
                    eprintln!("narad: warning: consume failed: {e} (retrying)");
                }
                if !pause(backoff(failures, Some(&e)), stop).await {
                    return Ok(());
                }
                failures += 1;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        seen += 1;
        let printed = {
            let mut out = std::io::stdout().lock();
            write_message(&mut out, &m, a.raw)
        };
        if let Err(e) = printed {
            // Nobody reads the output any more: hand the message back and stop.
            if let Some(h) = m.receipt_handle.as_deref() {
                let _ = client.nack(&m.topic, h).await;
            }
            if is_broken_pipe(&e) {
                return Ok(());
            }
            bail!("cannot write output: {e}");
        }
        if a.no_ack {
            continue;
        }
        if let Err(e) = ack_with_retry(client, &m, stop).await {
            let what = format!("{}/{}@{}", m.topic, m.partition, m.offset);
            if e.status() == Some(410) {
                eprintln!("narad: warning: ack of {what} failed: {e} (lease lost; the message will be redelivered)");
            } else {
                eprintln!(
                    "narad: warning: ack of {what} failed: {e} (the message will be redelivered)"
                );
            }
        }
    }
    Ok(())
}

/// Per-partition position of a peek.
struct Cursor {
    partition: u32,
    offset: u64,
    warned: bool,
}

async fn peek(client: &Client, a: &SubArgs, stop: &CancellationToken) -> anyhow::Result<()> {
    let t = client.get_topic(&a.topic, a.partition).await?;
    let mut cursors: Vec<Cursor> = match (&t.partition_stats, a.partition) {
        (Some(stats), _) if !stats.is_empty() => stats
            .iter()
            .filter(|s| a.partition.is_none_or(|p| p == s.index))
            .map(|s| Cursor {
                partition: s.index,
                offset: a.from.unwrap_or(s.high_watermark),
                warned: false,
            })
            .collect(),
        (_, Some(p)) => vec![Cursor {
            partition: p,
            offset: a.from.unwrap_or(0),
            warned: false,
        }],
        (_, None) => (0..t.partitions)
            .map(|p| Cursor {
                partition: p,
                offset: a.from.unwrap_or(0),
                warned: false,
            })
            .collect(),
    };
    let mut seen = 0u64;
    let mut failures = 0u32;
    loop {
        let mut progressed = false;
        let mut failed: Option<Error> = None;
        for c in cursors.iter_mut() {
            // Up to PEEK_ROUND messages of this partition, then the next one.
            for _ in 0..PEEK_ROUND {
                if a.count.is_some_and(|n| seen >= n) {
                    return Ok(());
                }
                let r = tokio::select! {
                    _ = stop.cancelled() => return Ok(()),
                    r = client.replay(&a.topic, c.partition, c.offset) => r,
                };
                match r {
                    Ok(Replay::Message(m)) => {
                        c.offset = m.offset.max(c.offset) + 1;
                        c.warned = false;
                        progressed = true;
                        seen += 1;
                        let mut out = std::io::stdout().lock();
                        if let Err(e) = write_message(&mut out, &m, a.raw) {
                            if is_broken_pipe(&e) {
                                return Ok(());
                            }
                            bail!("cannot write output: {e}");
                        }
                    }
                    Ok(Replay::End) => break,
                    Ok(Replay::Gone) => {
                        // Aged out: jump forward to the oldest retained offset.
                        let oldest = client
                            .get_topic(&a.topic, Some(c.partition))
                            .await
                            .ok()
                            .and_then(|t| t.partition_stats)
                            .and_then(|s| s.into_iter().find(|s| s.index == c.partition))
                            .map(|s| s.oldest_offset)
                            .unwrap_or(0);
                        let to = oldest.max(c.offset + 1);
                        eprintln!(
                            "narad: {}/{}: offsets {}..{} are gone, jumping to {to}",
                            a.topic, c.partition, c.offset, to
                        );
                        c.offset = to;
                        progressed = true;
                    }
                    Err(e) if e.is_retryable() => {
                        if !c.warned {
                            eprintln!(
                                "narad: warning: {}/{}: {e} (retrying)",
                                a.topic, c.partition
                            );
                            c.warned = true;
                        }
                        failed = Some(e);
                        break;
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
        let wait = match &failed {
            Some(e) if !progressed => {
                failures += 1;
                backoff(failures, Some(e))
            }
            _ => {
                failures = 0;
                PEEK_IDLE
            }
        };
        if !progressed && !pause(wait, stop).await {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoffs() {
        assert_eq!(backoff(0, None), Duration::from_millis(100));
        assert_eq!(backoff(1, None), Duration::from_millis(200));
        assert_eq!(backoff(10, None), Duration::from_secs(5));
        let e = Error::Api(narad_api::HttpError {
            status: 503,
            message: "x".into(),
            retry_after: Some(2),
        });
        assert_eq!(backoff(0, Some(&e)), Duration::from_secs(2));
    }
}
