//! `narad cluster members|moves|decommission` and `narad server report`.

use std::io::Write;

use narad_api::{MemberInfo, MoveInfo, TopicRecord};
use serde::Serialize;

use crate::conn::{connect, ConnArgs};
use crate::output::{human_bytes, Table};
use crate::topic::owner_spread;

/// `narad cluster …`
#[derive(Debug, clap::Subcommand)]
pub enum ClusterCmd {
    /// List cluster members
    Members {
        /// Print as JSON
        #[arg(long)]
        json: bool,
    },
    /// List partition moves in flight
    Moves {
        /// Print as JSON
        #[arg(long)]
        json: bool,
    },
    /// Start draining a member (--cancel to stop)
    Decommission {
        /// Member id (e.g. narad-3)
        id: String,
        /// Cancel a decommission
        #[arg(long)]
        cancel: bool,
    },
}

/// The `cluster members` table.
pub fn members_table(members: &[MemberInfo]) -> Table {
    let mut t = Table::new([
        "ID",
        "ADDR",
        "STATUS",
        "DRAINING",
        "PARTITIONS",
        "MOVES OUT",
        "LEADER",
        "VERSION",
    ]);
    for m in members {
        t.row([
            m.id.clone(),
            m.addr.clone(),
            m.status.clone(),
            if m.draining { "yes" } else { "no" }.to_string(),
            m.owned_partitions.to_string(),
            m.outbound_moves.to_string(),
            if m.leader { "*" } else { "" }.to_string(),
            if m.version.is_empty() {
                "-".into()
            } else {
                m.version.clone()
            },
        ]);
    }
    t
}

/// The `cluster moves` table.
pub fn moves_table(moves: &[MoveInfo]) -> Table {
    let mut t = Table::new(["TOPIC", "PARTITION", "FROM", "TO"]);
    for m in moves {
        t.row([
            m.topic.clone(),
            m.partition.to_string(),
            m.from.clone(),
            m.to.clone(),
        ]);
    }
    t
}

/// Runs a `cluster` command.
pub async fn run(cmd: ClusterCmd, conn: &ConnArgs) -> anyhow::Result<()> {
    let client = connect(conn)?;
    let mut out = std::io::stdout().lock();
    match cmd {
        ClusterCmd::Members { json } => {
            let members = client.members().await?;
            if json {
                serde_json::to_writer_pretty(&mut out, &members)?;
                writeln!(out)?;
            } else {
                members_table(&members).write(&mut out)?;
            }
        }
        ClusterCmd::Moves { json } => {
            let moves = client.moves().await?;
            if json {
                serde_json::to_writer_pretty(&mut out, &moves)?;
                writeln!(out)?;
            } else if moves.is_empty() {
                eprintln!("no moves in flight");
            } else {
                moves_table(&moves).write(&mut out)?;
            }
        }
        ClusterCmd::Decommission { id, cancel } => {
            if cancel {
                client.cancel_decommission(&id).await?;
                writeln!(out, "cancelled the decommission of {id}")?;
            } else {
                client.decommission(&id).await?;
                writeln!(
                    out,
                    "decommissioning {id}: it sheds its partitions; wait for 0 partitions in `narad cluster members` before removing it"
                )?;
            }
        }
    }
    Ok(())
}

/// Arguments of `narad server report`.
#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    /// Print as JSON
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub conn: ConnArgs,
}

/// One line of the server report.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct TopicReport {
    pub name: String,
    pub partitions: u32,
    /// Retained messages: Σ (high watermark − oldest offset).
    pub messages: u64,
    pub size_bytes: u64,
    /// Partitions per owner node, e.g. `narad-0:2 narad-1:1`.
    pub owners: String,
    /// Some owners did not answer (their numbers are missing).
    pub partial: bool,
}

/// Summarises a topic record with stats.
pub fn topic_report(t: &TopicRecord) -> TopicReport {
    let stats = t.partition_stats.as_deref().unwrap_or_default();
    TopicReport {
        name: t.name.clone(),
        partitions: t.partitions,
        messages: stats
            .iter()
            .map(|s| s.high_watermark.saturating_sub(s.oldest_offset))
            .sum(),
        size_bytes: stats.iter().map(|s| s.size_bytes).sum(),
        owners: owner_spread(t),
        partial: t.partial
            || stats
                .iter()
                .any(|s| !(s.status.is_empty() || s.status == "ok")),
    }
}

/// Writes the report table and totals.
pub fn write_report(out: &mut dyn Write, rows: &[TopicReport]) -> std::io::Result<()> {
    let mut t = Table::new(["TOPIC", "PARTITIONS", "MESSAGES", "SIZE", "OWNERS"]);
    for r in rows {
        t.row([
            r.name.clone(),
            r.partitions.to_string(),
            if r.partial {
                format!(">={}", r.messages)
            } else {
                r.messages.to_string()
            },
            human_bytes(r.size_bytes),
            r.owners.clone(),
        ]);
    }
    t.write(out)?;
    writeln!(
        out,
        "\n{} topics, {} partitions, {} messages, {}",
        rows.len(),
        rows.iter().map(|r| r.partitions as u64).sum::<u64>(),
        rows.iter().map(|r| r.messages).sum::<u64>(),
        human_bytes(rows.iter().map(|r| r.size_bytes).sum())
    )
}

/// Runs `server report`.
pub async fn report(args: ReportArgs) -> anyhow::Result<()> {
    let client = connect(&args.conn)?;
    let topics = client.list_topics().await?;
    let mut rows = Vec::with_capacity(topics.len());
    for t in &topics {
        match client.get_topic(&t.name, None).await {
            Ok(full) => rows.push(topic_report(&full)),
            // Deleted since the listing.
            Err(e) if e.status() == Some(404) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &rows)?;
        writeln!(out)?;
    } else {
        write_report(&mut out, &rows)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_rows() {
        let t: TopicRecord = serde_json::from_str(
            r#"{"name":"orders","partitions":3,"retention_ms":0,"visibility_timeout_ms":30000,
            "max_in_flight_per_partition":1024,"max_acked_ahead_per_partition":1024,"created_at":1,"role":"standalone",
            "partition_stats":[
             {"index":0,"segments":1,"oldest_offset":10,"next_offset":20,"high_watermark":20,"size_bytes":100,"owner_node":"n0","status":"ok"},
             {"index":1,"segments":1,"oldest_offset":0,"next_offset":5,"high_watermark":5,"size_bytes":50,"owner_node":"n1","status":"ok"},
             {"index":2,"segments":1,"oldest_offset":0,"next_offset":7,"high_watermark":7,"size_bytes":70,"owner_node":"n0","status":"ok"}]}"#,
        )
        .unwrap();
        let r = topic_report(&t);
        assert_eq!(r.messages, 22);
        assert_eq!(r.size_bytes, 220);
        assert_eq!(r.owners, "n0:2 n1:1");
        assert!(!r.partial);
        let mut out = Vec::new();
        write_report(&mut out, &[r]).unwrap();
        let s = String::from_utf8(out).unwrap();
        assert!(
            s.contains("orders  3           22        220 B  n0:2 n1:1"),
            "{s}"
        );
        assert!(
            s.contains("1 topics, 3 partitions, 22 messages, 220 B"),
            "{s}"
        );
    }
}
