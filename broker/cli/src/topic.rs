//! `narad topic add|ls|info|edit|rm|attach|detach|children|pause|resume|purge|seek|redrive`.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};

use anyhow::{bail, Context as _};
use narad_api::{
    AlterTopicRequest, AttachChildRequest, Client, CreateTopicRequest, DeadLetter, Redriven,
    RemoteTarget, Repositioned, SeekRequest, TopicRecord,
};
use serde_json::value::RawValue;

use crate::conn::{connect, ConnArgs};
use crate::output::{human_bytes, human_ms, human_retention, utc_ms, utc_secs, Table};

/// `narad topic …`
#[derive(Debug, clap::Subcommand)]
pub enum TopicCmd {
    /// Create a topic (with --parent: a replica child born attached)
    Add(AddArgs),
    /// List all topics
    Ls {
        /// Print the records as JSON
        #[arg(long)]
        json: bool,
    },
    /// Show a topic's record and per-partition stats
    Info {
        name: String,
        /// Only this partition's stats
        #[arg(long)]
        partition: Option<u32>,
        /// Print the record as JSON
        #[arg(long)]
        json: bool,
    },
    /// Change a topic's settings
    Edit(EditArgs),
    /// Delete a topic and all its data
    Rm {
        name: String,
        /// Do not ask for confirmation
        #[arg(long, short = 'f')]
        force: bool,
    },
    /// Attach a child topic (local, optionally delayed) or a remote link
    Attach(AttachArgs),
    /// Detach a child topic (it keeps its data)
    Detach { parent: String, child: String },
    /// List a parent's children with their lag
    Children {
        parent: String,
        /// Print the list as JSON
        #[arg(long)]
        json: bool,
    },
    /// Pause consumes (they get no messages until resumed; produce and replay go on)
    Pause {
        /// Topic name
        name: String,
    },
    /// Resume consumes of a paused topic
    Resume {
        /// Topic name
        name: String,
    },
    /// Settle every message committed so far: consumers skip the whole backlog
    Purge {
        /// Topic name
        name: String,
        /// Do not ask for confirmation
        #[arg(long, short = 'f')]
        force: bool,
        /// Print the partitions' frontiers as JSON
        #[arg(long)]
        json: bool,
    },
    /// Move where delivery resumes: back to redeliver, forward to skip
    Seek(SeekArgs),
    /// Move messages of a dead-letter topic back to the topics they came from (or to --to)
    Redrive {
        /// The dead-letter topic
        name: String,
        /// Move every message here instead of to its source topic
        #[arg(long, value_name = "TOPIC")]
        to: Option<String>,
        /// Move at most this many (default 1000, at most 100000)
        #[arg(long, value_name = "N")]
        max: Option<u64>,
        /// Print the result as JSON
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["offset", "timestamp"])))]
pub struct SeekArgs {
    /// Topic name
    pub name: String,
    /// Partition (needed with --offset; with --timestamp, this one only instead of all)
    #[arg(long, value_name = "P")]
    pub partition: Option<u32>,
    /// Offset delivery resumes at
    #[arg(long, value_name = "O", requires = "partition")]
    pub offset: Option<u64>,
    /// Resume at the first message committed at or after this time: Unix seconds or RFC 3339
    /// (2026-01-01T00:00:00Z)
    #[arg(long, value_name = "TIME", value_parser = parse_when)]
    pub timestamp: Option<u64>,
    /// Print the partitions' frontiers as JSON
    #[arg(long)]
    pub json: bool,
}

/// `--timestamp`: Unix seconds, or an RFC 3339 time (to the second, rounded down: the broker
/// compares whole seconds).
pub fn parse_when(v: &str) -> Result<u64, String> {
    if let Ok(secs) = v.parse::<u64>() {
        return Ok(secs);
    }
    let ts: jiff::Timestamp = v
        .parse()
        .map_err(|e| format!("{v:?} is neither Unix seconds nor an RFC 3339 time: {e}"))?;
    u64::try_from(ts.as_second()).map_err(|_| format!("{v:?} is before 1970"))
}

/// The seek request of the flags (clap enforces one of --offset and --timestamp, and
/// --partition with --offset).
pub fn seek_request(a: &SeekArgs) -> SeekRequest {
    SeekRequest {
        partition: a.partition,
        offset: a.offset,
        timestamp: a.timestamp,
    }
}

#[derive(Debug, clap::Args)]
pub struct AddArgs {
    /// Topic name
    pub name: String,
    /// Partition count (3–108; default 3, or the parent's with --parent)
    #[arg(long)]
    pub partitions: Option<u32>,
    /// Retention (e.g. 12h, 7d) or "forever"
    #[arg(long, value_name = "D|forever")]
    pub retention: Option<String>,
    /// Visibility timeout (e.g. 30s)
    #[arg(long, value_name = "D")]
    pub visibility: Option<String>,
    /// Backoff of redeliveries after an expired lease or a nack: MIN,MAX (e.g. 1s,5m), or off
    #[arg(long, value_name = "MIN,MAX")]
    pub retry_backoff: Option<String>,
    /// Dead-letter topic and deliveries before a message goes there: TOPIC:N (N 1-1000), or off
    #[arg(long, value_name = "TOPIC:N|off")]
    pub dead_letter: Option<String>,
    /// How long a produce's Idempotency-Key is remembered (1s to 24h; default 5m)
    #[arg(long, value_name = "D")]
    pub dedup_window: Option<String>,
    /// Leased messages per partition
    #[arg(long, value_name = "N")]
    pub max_in_flight: Option<u64>,
    /// Out-of-order acks parked per partition
    #[arg(long, value_name = "N")]
    pub max_acked_ahead: Option<u64>,
    /// Create as a replica child of this parent
    #[arg(long, value_name = "P")]
    pub parent: Option<String>,
    /// With --parent: delay child (e.g. 1h)
    #[arg(long, value_name = "D", requires = "parent")]
    pub delay: Option<String>,
    /// JSON Schema, inline or @FILE
    #[arg(long, value_name = "JSON|@FILE")]
    pub schema: Option<String>,
}

#[derive(Debug, Clone, clap::Args)]
pub struct EditArgs {
    /// Topic name
    pub name: String,
    /// Retention (e.g. 12h, 7d) or "forever"
    #[arg(long, value_name = "D|forever")]
    pub retention: Option<String>,
    /// Visibility timeout (e.g. 30s)
    #[arg(long, value_name = "D")]
    pub visibility: Option<String>,
    /// Backoff of redeliveries after an expired lease or a nack: MIN,MAX (e.g. 1s,5m), or off
    #[arg(long, value_name = "MIN,MAX")]
    pub retry_backoff: Option<String>,
    /// Dead-letter topic and deliveries before a message goes there: TOPIC:N (N 1-1000), or off
    #[arg(long, value_name = "TOPIC:N|off")]
    pub dead_letter: Option<String>,
    /// How long a produce's Idempotency-Key is remembered (1s to 24h; default 5m)
    #[arg(long, value_name = "D")]
    pub dedup_window: Option<String>,
    /// New partition count (grow only)
    #[arg(long)]
    pub partitions: Option<u32>,
    /// Leased messages per partition (0 = default)
    #[arg(long, value_name = "N")]
    pub max_in_flight: Option<u64>,
    /// Out-of-order acks parked per partition (0 = default)
    #[arg(long, value_name = "N")]
    pub max_acked_ahead: Option<u64>,
    /// New JSON Schema version, inline or @FILE
    #[arg(long, value_name = "JSON|@FILE")]
    pub schema: Option<String>,
}

#[derive(Debug, clap::Args)]
pub struct AttachArgs {
    /// Parent topic
    pub parent: String,
    /// Child topic (local) or link name (with --remote-url)
    pub child: String,
    /// Delay child: deliver each copy this long after the parent commit (e.g. 1h)
    #[arg(long, value_name = "D", conflicts_with = "remote_url")]
    pub delay: Option<String>,
    /// Remote link: base URL of the other cluster
    #[arg(long, value_name = "URL")]
    pub remote_url: Option<String>,
    /// Remote topic (default: the link name)
    #[arg(long, value_name = "T", requires = "remote_url")]
    pub remote_topic: Option<String>,
    /// Username on the remote cluster
    #[arg(long, value_name = "U", requires = "remote_url")]
    pub remote_user: Option<String>,
    /// Password on the remote cluster
    #[arg(long, value_name = "P", requires = "remote_url")]
    pub remote_password: Option<String>,
    /// Read the password on the remote cluster from the first line of stdin
    #[arg(long, requires = "remote_url", conflicts_with = "remote_password")]
    pub remote_password_stdin: bool,
    /// PEM file of an extra CA for the remote's https
    #[arg(long, value_name = "FILE", requires = "remote_url")]
    pub remote_ca: Option<std::path::PathBuf>,
}

/// Parses a human duration into milliseconds.
pub fn duration_ms(s: &str, what: &str) -> anyhow::Result<i64> {
    let d = narad_api::duration::parse_human_duration(s)
        .map_err(|_| anyhow::anyhow!("invalid {what} {s:?}: use a duration like 30s, 12h or 7d"))?;
    i64::try_from(d.as_millis()).context("duration too large")
}

/// Parses a retention: `forever` (or `0`) → 0, else a human duration in ms.
pub fn retention_ms(s: &str) -> anyhow::Result<i64> {
    if s.eq_ignore_ascii_case("forever") {
        return Ok(0);
    }
    duration_ms(s, "retention").map_err(|_| {
        anyhow::anyhow!("invalid retention {s:?}: use a duration like 12h or 7d, or \"forever\"")
    })
}

fn schema_arg(s: &str) -> anyhow::Result<Box<RawValue>> {
    let text = match s.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path)
            .with_context(|| format!("cannot read schema file {path}"))?,
        None => s.to_string(),
    };
    let v: serde_json::Value = serde_json::from_str(&text).context("schema is not valid JSON")?;
    Ok(serde_json::value::to_raw_value(&v)?)
}

fn to_i64(v: u64) -> anyhow::Result<i64> {
    i64::try_from(v).context("value too large")
}

/// Builds the create request from the flags.
pub fn create_request(a: &AddArgs) -> anyhow::Result<CreateTopicRequest> {
    Ok(CreateTopicRequest {
        name: a.name.clone(),
        partitions: a.partitions.map(i64::from),
        retention_ms: a.retention.as_deref().map(retention_ms).transpose()?,
        visibility_timeout_ms: a
            .visibility
            .as_deref()
            .map(|v| duration_ms(v, "visibility"))
            .transpose()?,
        max_in_flight_per_partition: a.max_in_flight.map(to_i64).transpose()?,
        max_acked_ahead_per_partition: a.max_acked_ahead.map(to_i64).transpose()?,
        schema: a.schema.as_deref().map(schema_arg).transpose()?,
        parent: a.parent.clone(),
        fanout_delay_ms: a
            .delay
            .as_deref()
            .map(|d| duration_ms(d, "delay"))
            .transpose()?,
        owner: None,
        retry_backoff: a.retry_backoff.as_deref().map(retry_backoff).transpose()?,
        dead_letter: a.dead_letter.as_deref().map(dead_letter).transpose()?,
        dedup_window_ms: a
            .dedup_window
            .as_deref()
            .map(|d| duration_ms(d, "dedup window"))
            .transpose()?,
    })
}

/// `--dead-letter TOPIC:N`, or `off`.
fn dead_letter(v: &str) -> anyhow::Result<DeadLetter> {
    if v == "off" {
        return Ok(DeadLetter::default());
    }
    let parsed = v
        .rsplit_once(':')
        .and_then(|(t, n)| Some((t, n.parse::<u32>().ok()?)))
        .filter(|(t, n)| !t.is_empty() && *n > 0);
    let Some((topic, max_deliveries)) = parsed else {
        bail!("--dead-letter takes TOPIC:N (e.g. orders-dlq:5) or off, got {v:?}");
    };
    Ok(DeadLetter {
        topic: topic.into(),
        max_deliveries,
    })
}

/// `--retry-backoff MIN,MAX` (Go durations), or `off`.
fn retry_backoff(v: &str) -> anyhow::Result<narad_api::RetryBackoff> {
    if v == "off" {
        return Ok(narad_api::RetryBackoff::from_ms(0, 0));
    }
    let Some((min, max)) = v.split_once(',') else {
        bail!("--retry-backoff takes MIN,MAX (e.g. 1s,5m) or off, got {v:?}");
    };
    for d in [min, max] {
        narad_api::duration::parse_go_duration(d)
            .map_err(|e| anyhow::anyhow!("--retry-backoff {v:?}: {e}"))?;
    }
    Ok(narad_api::RetryBackoff {
        min: min.into(),
        max: max.into(),
    })
}

/// Builds the alter request from the flags; an empty change is an error.
pub fn alter_request(a: &EditArgs) -> anyhow::Result<AlterTopicRequest> {
    let r = AlterTopicRequest {
        partitions: a.partitions.map(i64::from),
        retention_ms: a.retention.as_deref().map(retention_ms).transpose()?,
        visibility_timeout_ms: a
            .visibility
            .as_deref()
            .map(|v| duration_ms(v, "visibility"))
            .transpose()?,
        max_in_flight_per_partition: a.max_in_flight.map(to_i64).transpose()?,
        max_acked_ahead_per_partition: a.max_acked_ahead.map(to_i64).transpose()?,
        schema: a.schema.as_deref().map(schema_arg).transpose()?,
        schema_base_version: None,
        retry_backoff: a.retry_backoff.as_deref().map(retry_backoff).transpose()?,
        dead_letter: a.dead_letter.as_deref().map(dead_letter).transpose()?,
        dedup_window_ms: a
            .dedup_window
            .as_deref()
            .map(|d| duration_ms(d, "dedup window"))
            .transpose()?,
    };
    if r.partitions.is_none()
        && r.retention_ms.is_none()
        && r.visibility_timeout_ms.is_none()
        && r.max_in_flight_per_partition.is_none()
        && r.max_acked_ahead_per_partition.is_none()
        && r.schema.is_none()
        && r.retry_backoff.is_none()
        && r.dead_letter.is_none()
        && r.dedup_window_ms.is_none()
    {
        bail!("nothing to change: give at least one of --retention, --visibility, --partitions, --max-in-flight, --max-acked-ahead, --schema, --retry-backoff, --dead-letter, --dedup-window");
    }
    Ok(r)
}

fn attach_request(a: &AttachArgs) -> anyhow::Result<AttachChildRequest> {
    let remote = match &a.remote_url {
        None => None,
        Some(url) => Some(RemoteTarget {
            url: url.clone(),
            topic: a.remote_topic.clone(),
            username: a.remote_user.clone(),
            password: a.remote_password.clone(),
            ca_pem: a
                .remote_ca
                .as_ref()
                .map(|p| {
                    std::fs::read_to_string(p)
                        .with_context(|| format!("cannot read {}", p.display()))
                })
                .transpose()?,
        }),
    };
    Ok(AttachChildRequest {
        child: a.child.clone(),
        delay_ms: a
            .delay
            .as_deref()
            .map(|d| duration_ms(d, "delay"))
            .transpose()?,
        remote,
    })
}

/// One-line summary of a record.
pub fn summary(t: &TopicRecord) -> String {
    let mut s = format!(
        "{} ({} partitions, retention {}, visibility {}, role {}",
        t.name,
        t.partitions,
        human_retention(t.retention_ms),
        human_ms(t.visibility_timeout_ms),
        t.role
    );
    if let Some(p) = &t.parent {
        s.push_str(&format!(", parent {p}"));
    }
    if t.fanout_delay_ms > 0 {
        s.push_str(&format!(", delay {}", human_ms(t.fanout_delay_ms)));
    }
    if t.paused {
        s.push_str(", paused");
    }
    s.push(')');
    s
}

/// The `topic ls` table.
pub fn list_table(topics: &[TopicRecord]) -> Table {
    let mut t = Table::new([
        "NAME",
        "PARTITIONS",
        "RETENTION",
        "VISIBILITY",
        "ROLE",
        "PARENT",
        "OWNER",
    ]);
    for r in topics {
        let parent = match (&r.parent, r.fanout_delay_ms) {
            (Some(p), 0) => p.clone(),
            (Some(p), d) => format!("{p} (+{})", human_ms(d)),
            (None, _) => "-".into(),
        };
        t.row([
            r.name.clone(),
            r.partitions.to_string(),
            human_retention(r.retention_ms),
            human_ms(r.visibility_timeout_ms),
            r.role.clone(),
            parent,
            r.owner
                .clone()
                .filter(|o| !o.is_empty())
                .unwrap_or_else(|| "-".into()),
        ]);
    }
    t
}

/// The `topic redrive` text: what moved where, and what stayed.
pub fn write_redriven(out: &mut dyn Write, from: &str, r: &Redriven) -> std::io::Result<()> {
    writeln!(out, "moved {} message(s) from {from}", r.moved)?;
    for (to, n) in &r.to {
        writeln!(out, "  {n} to {to}")?;
    }
    if r.skipped > 0 {
        writeln!(
            out,
            "left {} message(s) in {from}: {}",
            r.skipped,
            r.last_error.as_deref().unwrap_or("")
        )?;
    }
    Ok(())
}

/// The `topic info` text.
pub fn write_info(out: &mut dyn Write, t: &TopicRecord) -> std::io::Result<()> {
    let mut kv: Vec<(&str, String)> = vec![("name", t.name.clone())];
    if t.paused {
        kv.push((
            "paused",
            "yes: consumes get no messages until resumed".into(),
        ));
    }
    kv.extend([
        ("role", t.role.clone()),
        ("partitions", t.partitions.to_string()),
        ("retention", human_retention(t.retention_ms)),
        ("visibility timeout", human_ms(t.visibility_timeout_ms)),
        (
            "max in flight",
            format!("{} per partition", t.max_in_flight_per_partition),
        ),
        (
            "max acked ahead",
            format!("{} per partition", t.max_acked_ahead_per_partition),
        ),
    ]);
    if let Some(b) = &t.retry_backoff {
        kv.push(("retry backoff", format!("{} doubling to {}", b.min, b.max)));
    }
    if let Some(d) = &t.dead_letter {
        kv.push((
            "dead letter",
            format!("{} after {} deliveries", d.topic, d.max_deliveries),
        ));
    }
    if let Some(b) = &t.backlog {
        kv.push((
            "backlog",
            format!(
                "{} waiting, {} in flight, oldest unsettled {}",
                b.messages,
                b.in_flight,
                human_ms(b.oldest_unacked_age_seconds.saturating_mul(1000))
            ),
        ));
    }
    if t.created_at > 0 {
        kv.push(("created", utc_ms(t.created_at)));
    }
    if let Some(o) = t.owner.as_ref().filter(|o| !o.is_empty()) {
        kv.push(("owner", o.clone()));
    }
    if let Some(p) = &t.parent {
        kv.push(("parent", p.clone()));
        if t.fanout_delay_ms > 0 {
            kv.push(("delay", human_ms(t.fanout_delay_ms)));
        }
    }
    if !t.children.is_empty() {
        kv.push(("children", t.children.join(", ")));
    }
    if !t.remote_children.is_empty() {
        kv.push(("remote children", t.remote_children.join(", ")));
    }
    if let Some(s) = &t.schema {
        kv.push((
            "schema",
            format!("version {} {}", t.schema_version, s.get()),
        ));
    }
    let w = kv.iter().map(|(k, _)| k.len()).max().unwrap_or(0) + 1;
    for (k, v) in &kv {
        writeln!(out, "{:<w$} {v}", format!("{k}:"), w = w)?;
    }
    if let Some(stats) = &t.partition_stats {
        writeln!(out)?;
        let mut tab = Table::new([
            "PARTITION",
            "OWNER",
            "STATUS",
            "OLDEST",
            "NEXT",
            "HIGH WATERMARK",
            "MESSAGES",
            "SEGMENTS",
            "SIZE",
            "OLDEST SEGMENT",
        ]);
        let mut total_msgs = 0u64;
        let mut total_size = 0u64;
        for p in stats {
            let ok = p.status.is_empty() || p.status == "ok";
            let status = if ok {
                "ok".to_string()
            } else {
                match &p.owner_liveness {
                    Some(l) => format!("{} ({l})", p.status),
                    None => p.status.clone(),
                }
            };
            let msgs = p.high_watermark.saturating_sub(p.oldest_offset);
            total_msgs += msgs;
            total_size += p.size_bytes;
            let dash = |v: String| if ok { v } else { "-".to_string() };
            tab.row([
                p.index.to_string(),
                if p.owner_node.is_empty() {
                    "-".into()
                } else {
                    p.owner_node.clone()
                },
                status,
                dash(p.oldest_offset.to_string()),
                dash(p.next_offset.to_string()),
                dash(p.high_watermark.to_string()),
                dash(msgs.to_string()),
                dash(p.segments.to_string()),
                dash(human_bytes(p.size_bytes)),
                p.oldest_segment_at
                    .filter(|&s| s > 0)
                    .map(utc_secs)
                    .unwrap_or_else(|| "-".into()),
            ]);
        }
        tab.write(out)?;
        writeln!(
            out,
            "\n{} retained messages, {} on disk{}",
            total_msgs,
            human_bytes(total_size),
            if t.partial {
                " (partial: some owners did not answer)"
            } else {
                ""
            }
        )?;
    }
    Ok(())
}

fn confirm(prompt: &str) -> anyhow::Result<bool> {
    eprint!("{prompt} [y/N] ");
    std::io::stderr().flush().ok();
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    Ok(matches!(
        line.trim().to_ascii_lowercase().as_str(),
        "y" | "yes"
    ))
}

/// Runs a `topic` command.
pub async fn run(mut cmd: TopicCmd, conn: &ConnArgs) -> anyhow::Result<()> {
    let client = connect(conn)?;
    if let TopicCmd::Attach(a) = &mut cmd {
        if a.remote_password_stdin {
            let p = crate::conn::flag_or_stdin(None, true, "remote-password", conn)?;
            a.remote_password = Some(p);
        }
    }
    run_with(cmd, &client).await
}

async fn run_with(cmd: TopicCmd, client: &Client) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match cmd {
        TopicCmd::Add(a) => {
            let req = create_request(&a)?;
            let t = client.create_topic(&req).await?;
            writeln!(out, "created topic {}", summary(&t))?;
        }
        TopicCmd::Ls { json } => {
            let topics = client.list_topics().await?;
            if json {
                serde_json::to_writer_pretty(&mut out, &topics)?;
                writeln!(out)?;
            } else if topics.is_empty() {
                eprintln!("no topics");
            } else {
                list_table(&topics).write(&mut out)?;
            }
        }
        TopicCmd::Info {
            name,
            partition,
            json,
        } => {
            let t = client.get_topic(&name, partition).await?;
            if json {
                serde_json::to_writer_pretty(&mut out, &t)?;
                writeln!(out)?;
            } else {
                write_info(&mut out, &t)?;
            }
        }
        TopicCmd::Edit(a) => {
            let req = alter_request(&a)?;
            let t = client.alter_topic(&a.name, &req).await?;
            writeln!(out, "updated topic {}", summary(&t))?;
        }
        TopicCmd::Rm { name, force } => {
            if !force {
                if !std::io::stdin().is_terminal() {
                    bail!("refusing to delete topic {name} without confirmation: stdin is not a terminal (use -f to delete anyway)");
                }
                if !confirm(&format!("delete topic {name} and all its messages?"))? {
                    bail!("aborted: topic {name} not deleted");
                }
            }
            client.delete_topic(&name).await?;
            writeln!(out, "deleted topic {name}")?;
        }
        TopicCmd::Pause { name } => {
            let t = client.pause_topic(&name).await?;
            writeln!(
                out,
                "paused topic {}: consumes get no messages until `narad topic resume {}`",
                t.name, t.name
            )?;
        }
        TopicCmd::Resume { name } => {
            let t = client.resume_topic(&name).await?;
            writeln!(out, "resumed topic {}", t.name)?;
        }
        TopicCmd::Purge { name, force, json } => {
            if !force {
                if !std::io::stdin().is_terminal() {
                    bail!("refusing to purge topic {name} without confirmation: stdin is not a terminal (use -f to purge anyway)");
                }
                if !confirm(&format!(
                    "purge topic {name}: settle every message committed so far, unconsumed or not?"
                ))? {
                    bail!("aborted: topic {name} not purged");
                }
            }
            let r = client.purge_topic(&name).await?;
            write_repositioned(&mut out, "purged", &r, json)?;
        }
        TopicCmd::Seek(a) => {
            let r = client.seek_topic(&a.name, &seek_request(&a)).await?;
            write_repositioned(&mut out, "repositioned", &r, a.json)?;
        }
        TopicCmd::Redrive {
            name,
            to,
            max,
            json,
        } => {
            let r = client.redrive_topic(&name, to.as_deref(), max).await?;
            if json {
                serde_json::to_writer_pretty(&mut out, &r)?;
                writeln!(out)?;
            } else {
                write_redriven(&mut out, &name, &r)?;
            }
        }
        TopicCmd::Attach(a) => {
            let req = attach_request(&a)?;
            let parent = client.attach_child(&a.parent, &req).await?;
            let what = match (&a.remote_url, &a.delay) {
                (Some(u), _) => format!("remote link {} → {u}", a.child),
                (None, Some(d)) => format!("delay child {} (+{d})", a.child),
                (None, None) => format!("child {}", a.child),
            };
            writeln!(out, "attached {what} to {}", parent.name)?;
        }
        TopicCmd::Detach { parent, child } => {
            client.detach_child(&parent, &child).await?;
            writeln!(out, "detached {child} from {parent}")?;
        }
        TopicCmd::Children { parent, json } => {
            let list = client.list_children(&parent).await?;
            if json {
                serde_json::to_writer_pretty(&mut out, &list)?;
                writeln!(out)?;
            } else if list.children.is_empty() {
                eprintln!("{parent} has no children");
            } else {
                children_table(&list).write(&mut out)?;
            }
        }
    }
    Ok(())
}

/// The answer of `topic purge` and `topic seek`: a line and each partition's frontier
/// before and after (`--json`: the answer itself).
pub fn write_repositioned(
    out: &mut dyn Write,
    what: &str,
    r: &Repositioned,
    json: bool,
) -> anyhow::Result<()> {
    if json {
        serde_json::to_writer_pretty(&mut *out, r)?;
        writeln!(out)?;
        return Ok(());
    }
    writeln!(out, "{what} topic {}", r.topic)?;
    let mut t = Table::new(["PARTITION", "FRONTIER"]);
    for p in &r.partitions {
        t.row([
            p.partition.to_string(),
            format!("{} -> {}", p.previous_frontier, p.frontier),
        ]);
    }
    t.write(out)?;
    Ok(())
}

/// The `topic children` table.
pub fn children_table(list: &narad_api::ChildList) -> Table {
    let mut t = Table::new([
        "CHILD",
        "KIND",
        "DELAY",
        "LAG",
        "TARGET",
        "STATE",
        "LAST ERROR",
    ]);
    for c in &list.children {
        let kind = if c.kind.is_empty() {
            if c.delay_ms > 0 { "delay" } else { "fanout" }.to_string()
        } else {
            c.kind.clone()
        };
        t.row([
            c.name.clone(),
            kind,
            if c.delay_ms > 0 {
                human_ms(c.delay_ms)
            } else {
                "-".into()
            },
            if c.lag_complete {
                c.lag_messages.to_string()
            } else {
                format!(">={}", c.lag_messages)
            },
            c.remote
                .as_ref()
                .map(|r| format!("{}/{}", r.url, r.topic))
                .unwrap_or_else(|| "-".into()),
            c.state.clone().unwrap_or_else(|| "-".into()),
            c.last_error.clone().unwrap_or_default(),
        ]);
    }
    t
}

/// Owner spread of a topic's partitions: `narad-0:2 narad-1:1`.
pub fn owner_spread(t: &TopicRecord) -> String {
    let mut m: BTreeMap<&str, u32> = BTreeMap::new();
    for p in t.partition_stats.iter().flatten() {
        let o = if p.owner_node.is_empty() {
            "?"
        } else {
            p.owner_node.as_str()
        };
        *m.entry(o).or_default() += 1;
    }
    m.iter()
        .map(|(k, v)| format!("{k}:{v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn add(name: &str) -> AddArgs {
        AddArgs {
            name: name.into(),
            partitions: None,
            retention: None,
            visibility: None,
            max_in_flight: None,
            max_acked_ahead: None,
            parent: None,
            delay: None,
            schema: None,
            retry_backoff: None,
            dead_letter: None,
            dedup_window: None,
        }
    }

    #[test]
    fn create_requests() {
        let mut a = add("orders");
        a.partitions = Some(6);
        a.retention = Some("7d".into());
        a.visibility = Some("45s".into());
        a.max_in_flight = Some(10);
        a.schema = Some(r#"{"type": "object"}"#.into());
        let r = create_request(&a).unwrap();
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            r#"{"name":"orders","partitions":6,"retention_ms":604800000,"visibility_timeout_ms":45000,"max_in_flight_per_partition":10,"schema":{"type":"object"}}"#
        );
        let mut a = add("x");
        a.retention = Some("forever".into());
        a.parent = Some("orders".into());
        a.delay = Some("1h".into());
        let r = create_request(&a).unwrap();
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            r#"{"name":"x","retention_ms":0,"parent":"orders","fanout_delay_ms":3600000}"#
        );
        let mut a = add("x");
        a.retention = Some("7days".into());
        assert!(create_request(&a)
            .unwrap_err()
            .to_string()
            .contains("invalid retention"));
        let mut a = add("x");
        a.schema = Some("{nope".into());
        assert!(create_request(&a).is_err());
    }

    #[test]
    fn alter_requests() {
        let e = EditArgs {
            name: "t".into(),
            retention: Some("12h".into()),
            visibility: None,
            partitions: Some(9),
            max_in_flight: None,
            max_acked_ahead: None,
            schema: None,
            retry_backoff: None,
            dead_letter: None,
            dedup_window: None,
        };
        assert_eq!(
            serde_json::to_string(&alter_request(&e).unwrap()).unwrap(),
            r#"{"partitions":9,"retention_ms":43200000}"#
        );
        let window = EditArgs {
            retention: None,
            partitions: None,
            dedup_window: Some("10m".into()),
            ..e.clone()
        };
        assert_eq!(
            serde_json::to_string(&alter_request(&window).unwrap()).unwrap(),
            r#"{"dedup_window_ms":600000}"#
        );
        let backoff = EditArgs {
            retry_backoff: Some("1s,5m".into()),
            retention: None,
            partitions: None,
            ..e.clone()
        };
        assert_eq!(
            serde_json::to_string(&alter_request(&backoff).unwrap()).unwrap(),
            r#"{"retry_backoff":{"min":"1s","max":"5m"}}"#
        );
        let off = EditArgs {
            retry_backoff: Some("off".into()),
            ..backoff.clone()
        };
        assert_eq!(
            serde_json::to_string(&alter_request(&off).unwrap()).unwrap(),
            r#"{"retry_backoff":{"min":"0s","max":"0s"}}"#
        );
        for bad in ["1s", "1s,soon", "x,5m"] {
            let b = EditArgs {
                retry_backoff: Some(bad.into()),
                ..backoff.clone()
            };
            assert!(alter_request(&b).is_err(), "{bad}");
        }
        let dead = EditArgs {
            retry_backoff: None,
            dead_letter: Some("orders-dlq:5".into()),
            ..backoff.clone()
        };
        assert_eq!(
            serde_json::to_string(&alter_request(&dead).unwrap()).unwrap(),
            r#"{"dead_letter":{"topic":"orders-dlq","max_deliveries":5}}"#
        );
        let off = EditArgs {
            dead_letter: Some("off".into()),
            ..dead.clone()
        };
        assert_eq!(
            serde_json::to_string(&alter_request(&off).unwrap()).unwrap(),
            r#"{"dead_letter":{"topic":"","max_deliveries":0}}"#
        );
        for bad in [
            "orders-dlq",
            "orders-dlq:",
            ":5",
            "dlq:0",
            "dlq:-1",
            "dlq:many",
        ] {
            let b = EditArgs {
                dead_letter: Some(bad.into()),
                ..dead.clone()
            };
            assert!(
                alter_request(&b)
                    .unwrap_err()
                    .to_string()
                    .contains("TOPIC:N"),
                "{bad}"
            );
        }
        let none = EditArgs {
            name: "t".into(),
            retention: None,
            visibility: None,
            partitions: None,
            max_in_flight: None,
            max_acked_ahead: None,
            schema: None,
            retry_backoff: None,
            dead_letter: None,
            dedup_window: None,
        };
        assert!(alter_request(&none)
            .unwrap_err()
            .to_string()
            .contains("nothing to change"));
    }

    fn record(json: &str) -> TopicRecord {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn redrive_output_says_what_moved_where_and_what_stayed() {
        let r: Redriven = serde_json::from_str(
            r#"{"moved":5,"to":{"a":3,"b":2},"skipped":1,"last_error":"topic c not found"}"#,
        )
        .unwrap();
        let mut out = Vec::new();
        write_redriven(&mut out, "dlq", &r).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "moved 5 message(s) from dlq\n  3 to a\n  2 to b\nleft 1 message(s) in dlq: topic c not found\n"
        );
        let mut out = Vec::new();
        write_redriven(&mut out, "dlq", &Redriven::default()).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "moved 0 message(s) from dlq\n"
        );
    }

    #[test]
    fn listing_and_info() {
        let t = record(
            r#"{"name":"orders","partitions":3,"retention_ms":604800000,"visibility_timeout_ms":30000,
            "max_in_flight_per_partition":1024,"max_acked_ahead_per_partition":1024,"created_at":1767225600000,
            "owner":"svc","role":"parent","children":["orders-audit"],"schema":{"type":"object"},"schema_version":1,
            "partition_stats":[
             {"index":0,"segments":2,"oldest_offset":120,"next_offset":4512,"high_watermark":4512,"size_bytes":1048576,
              "oldest_segment_at":1767225700,"owner_node":"narad-1","status":"ok"},
             {"index":1,"segments":0,"oldest_offset":0,"next_offset":0,"high_watermark":0,"size_bytes":0,
              "owner_node":"narad-2","status":"owner_unavailable","owner_liveness":"dead"}],"partial":true}"#,
        );
        let mut out = Vec::new();
        list_table(std::slice::from_ref(&t))
            .write(&mut out)
            .unwrap();
        let s = String::from_utf8(out).unwrap();
        assert!(
            s.contains("orders  3           7d         30s         parent  -       svc"),
            "{s}"
        );
        let mut out = Vec::new();
        write_info(&mut out, &t).unwrap();
        let s = String::from_utf8(out).unwrap();
        assert!(s.contains("retention:"), "{s}");
        assert!(s.contains("7d"));
        assert!(s.contains("2026-01-01T00:00:00Z"));
        assert!(s.contains("owner_unavailable (dead)"));
        assert!(
            s.contains("4392 retained messages, 1.0 MiB on disk (partial"),
            "{s}"
        );
        assert_eq!(owner_spread(&t), "narad-1:1 narad-2:1");
        assert_eq!(
            summary(&t),
            "orders (3 partitions, retention 7d, visibility 30s, role parent)"
        );
        assert!(!s.contains("paused"), "{s}");
        assert!(
            !s.contains("backlog") && !s.contains("retry backoff"),
            "{s}"
        );
        let t = record(
            r#"{"name":"orders","partitions":3,"retention_ms":0,"visibility_timeout_ms":30000,
            "max_in_flight_per_partition":1024,"max_acked_ahead_per_partition":1024,"created_at":0,
            "role":"standalone","retry_backoff":{"min":"1s","max":"5m0s"},
            "dead_letter":{"topic":"orders-dlq","max_deliveries":5},
            "backlog":{"messages":7,"in_flight":2,"oldest_unacked_age_seconds":90}}"#,
        );
        let mut out = Vec::new();
        write_info(&mut out, &t).unwrap();
        let s = String::from_utf8(out).unwrap();
        assert!(
            s.contains("retry backoff:      1s doubling to 5m0s\n"),
            "{s}"
        );
        assert!(
            s.contains("dead letter:        orders-dlq after 5 deliveries\n"),
            "{s}"
        );
        assert!(
            s.contains("backlog:            7 waiting, 2 in flight, oldest unsettled 1m30s\n"),
            "{s}"
        );
    }

    #[test]
    fn paused_topics_and_moved_frontiers() {
        let t = record(
            r#"{"name":"orders","partitions":3,"retention_ms":0,"visibility_timeout_ms":30000,
            "max_in_flight_per_partition":1024,"max_acked_ahead_per_partition":1024,"created_at":0,
            "role":"standalone","paused":true}"#,
        );
        let mut out = Vec::new();
        write_info(&mut out, &t).unwrap();
        let s = String::from_utf8(out).unwrap();
        assert!(
            s.starts_with("name:               orders\npaused:             yes: consumes get no messages until resumed\nrole:"),
            "{s}"
        );
        assert_eq!(
            summary(&t),
            "orders (3 partitions, retention forever, visibility 30s, role standalone, paused)"
        );

        let r: Repositioned = serde_json::from_str(
            r#"{"topic":"orders","partitions":[
            {"partition":0,"previous_frontier":3,"frontier":4512},
            {"partition":1,"previous_frontier":50,"frontier":42}]}"#,
        )
        .unwrap();
        let mut out = Vec::new();
        write_repositioned(&mut out, "purged", &r, false).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "purged topic orders\nPARTITION  FRONTIER\n0          3 -> 4512\n1          50 -> 42\n"
        );
        let mut out = Vec::new();
        write_repositioned(&mut out, "repositioned", &r, true).unwrap();
        let back: Repositioned = serde_json::from_slice(&out).unwrap();
        assert_eq!(back, r);
    }
}
