//! `narad replay <topic> --partition N [--from O] [--to O] [--raw]`: bounded history, by
//! default from the oldest retained offset up to the high watermark.

use anyhow::bail;
use narad_api::{Client, Replay};

use crate::conn::{connect, ConnArgs};
use crate::output::{is_broken_pipe, write_message};
use crate::subscribe::ctrl_c_token;

#[derive(Debug, clap::Args)]
pub struct ReplayArgs {
    /// Topic
    pub topic: String,
    /// Partition to read
    #[arg(long)]
    pub partition: u32,
    /// First offset (default: the oldest retained)
    #[arg(long, value_name = "O")]
    pub from: Option<u64>,
    /// Stop before this offset (default: the high watermark)
    #[arg(long, value_name = "O")]
    pub to: Option<u64>,
    /// Print decoded payloads only, one per line
    #[arg(long)]
    pub raw: bool,
    #[command(flatten)]
    pub conn: ConnArgs,
}

/// The partition's (oldest offset, high watermark).
async fn bounds(client: &Client, topic: &str, partition: u32) -> anyhow::Result<(u64, u64)> {
    let t = client.get_topic(topic, Some(partition)).await?;
    let s = t
        .partition_stats
        .unwrap_or_default()
        .into_iter()
        .find(|s| s.index == partition);
    match s {
        Some(s) if s.status.is_empty() || s.status == "ok" => {
            Ok((s.oldest_offset, s.high_watermark))
        }
        Some(s) => bail!(
            "partition {partition} of {topic} is unavailable ({}{})",
            s.status,
            s.owner_liveness
                .map(|l| format!(", owner {l}"))
                .unwrap_or_default()
        ),
        None => bail!("no stats for partition {partition} of {topic}"),
    }
}

/// Runs `replay`.
pub async fn run(a: ReplayArgs) -> anyhow::Result<()> {
    let client = connect(&a.conn)?;
    let stop = ctrl_c_token();
    let (oldest, hwm) = if a.from.is_some() && a.to.is_some() {
        (0, 0)
    } else {
        bounds(&client, &a.topic, a.partition).await?
    };
    let from = a.from.unwrap_or(oldest);
    let to = a.to.unwrap_or(hwm);
    let mut offset = from;
    let (mut printed, mut gone) = (0u64, 0u64);
    while offset < to {
        let r = tokio::select! {
            _ = stop.cancelled() => break,
            r = client.replay(&a.topic, a.partition, offset) => r?,
        };
        match r {
            Replay::Message(m) => {
                let mut out = std::io::stdout().lock();
                if let Err(e) = write_message(&mut out, &m, a.raw) {
                    if is_broken_pipe(&e) {
                        return Ok(());
                    }
                    bail!("cannot write output: {e}");
                }
                printed += 1;
                offset = m.offset.max(offset) + 1;
            }
            Replay::End => break,
            Replay::Gone => {
                // Skip what retention removed (or an unreadable record).
                let (oldest, _) = bounds(&client, &a.topic, a.partition)
                    .await
                    .unwrap_or((0, 0));
                let next = oldest.max(offset + 1).min(to);
                gone += next - offset;
                offset = next;
            }
        }
    }
    if gone > 0 {
        eprintln!(
            "narad: {gone} offsets of {}/{} are gone (retention)",
            a.topic, a.partition
        );
    }
    if printed == 0 && !a.raw {
        eprintln!(
            "no messages in {}/{} between offsets {from} and {to}",
            a.topic, a.partition
        );
    }
    Ok(())
}
