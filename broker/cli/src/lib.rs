//! The client commands of `narad` (SPEC §7.2): topic, pub, sub, replay, bench, ctx, user,
//! cluster, server report. Built on `narad_api::client`.
//!
//! Errors are returned as `anyhow` errors whose `Display` is one line (HTTP errors read
//! `http <code>: <server message>`); the binary prints `narad: <message>` and exits 1.
//!
//! Modules: `conn` (connection flags, resolution), `ctx` (contexts file), `topic`, `publish`
//! (`pub`), `subscribe` (`sub`), `replay`, `bench`, `user`, `cluster` (also `server report`),
//! `output` (tables, units, message printing).

pub mod bench;
pub mod cluster;
pub mod conn;
pub mod ctx;
pub mod output;
pub mod publish;
pub mod replay;
pub mod subscribe;
pub mod topic;
pub mod user;

/// Every environment variable the client commands read (`narad server start` accepts them
/// too: one shell serves both).
pub const ENV_NAMES: &[&str] = &[
    "NARAD_ADDR",
    "NARAD_USER",
    "NARAD_PASS",
    "NARAD_CA_FILE",
    "NARAD_CONFIG_DIR",
];

pub use cluster::ReportArgs;
pub use conn::ConnArgs;

/// Client subcommands, flattened into the `narad` binary's top level.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Manage topics
    #[command(visible_alias = "topics")]
    Topic {
        #[command(subcommand)]
        cmd: topic::TopicCmd,
        #[command(flatten)]
        conn: ConnArgs,
    },
    /// Publish a message (from the argument, --file or stdin)
    Pub(publish::PubArgs),
    /// Consume messages: print and ack them (--peek: read-only tail)
    Sub(subscribe::SubArgs),
    /// Print a partition's history
    Replay(replay::ReplayArgs),
    /// Measure produce (and consume) throughput and latency
    Bench(bench::BenchArgs),
    /// Manage users and grants
    User {
        #[command(subcommand)]
        cmd: user::UserCmd,
        #[command(flatten)]
        conn: ConnArgs,
    },
    /// Cluster members, moves and decommission
    Cluster {
        #[command(subcommand)]
        cmd: cluster::ClusterCmd,
        #[command(flatten)]
        conn: ConnArgs,
    },
    /// Manage connection contexts
    Ctx {
        #[command(subcommand)]
        cmd: ctx::CtxCmd,
    },
}

impl Command {
    /// The connection flags of this command (`ctx` takes none).
    fn conn_mut(&mut self) -> Option<&mut ConnArgs> {
        match self {
            Command::Topic { conn, .. }
            | Command::User { conn, .. }
            | Command::Cluster { conn, .. } => Some(conn),
            Command::Pub(a) => Some(&mut a.conn),
            Command::Sub(a) => Some(&mut a.conn),
            Command::Replay(a) => Some(&mut a.conn),
            Command::Bench(a) => Some(&mut a.conn),
            Command::Ctx { .. } => None,
        }
    }
}

/// Applies the connection flags written before the subcommand (`leading`, see
/// [`conn::leading_args`]) to a command's own: refused for a command that takes none.
pub fn apply_leading(conn: Option<&mut ConnArgs>, leading: &ConnArgs) -> anyhow::Result<()> {
    match conn {
        Some(c) => c.fill_from(leading),
        None if !leading.is_empty() => {
            anyhow::bail!("connection flags (-s, -u, -p, --ca-file) do not apply to this command")
        }
        None => {}
    }
    Ok(())
}

/// Runs one client command; `leading` are the connection flags given before it.
pub async fn run(mut cmd: Command, leading: &ConnArgs) -> anyhow::Result<()> {
    apply_leading(cmd.conn_mut(), leading)?;
    match cmd {
        Command::Topic { cmd, conn } => topic::run(cmd, &conn).await,
        Command::Pub(a) => publish::run(a).await,
        Command::Sub(a) => subscribe::run(a).await,
        Command::Replay(a) => replay::run(a).await,
        Command::Bench(a) => bench::run(a).await,
        Command::User { cmd, conn } => user::run(cmd, &conn).await,
        Command::Cluster { cmd, conn } => cluster::run(cmd, &conn).await,
        Command::Ctx { cmd } => ctx::run(cmd),
    }
}

/// Runs `narad server report`.
pub async fn server_report(mut args: ReportArgs, leading: &ConnArgs) -> anyhow::Result<()> {
    apply_leading(Some(&mut args.conn), leading)?;
    cluster::report(args).await
}

#[cfg(test)]
mod cli_tests;

#[cfg(test)]
mod env_names_tests {
    /// Every `env("NARAD_…")` the client commands look up is in [`super::ENV_NAMES`] (which
    /// `narad server start` accepts), and nothing else is.
    #[test]
    fn env_names_lists_every_name_the_commands_read() {
        let mut read: Vec<String> = [include_str!("conn.rs"), include_str!("ctx.rs")]
            .iter()
            .flat_map(|src| {
                src.match_indices("env(\"NARAD_").map(move |(i, m)| {
                    let rest = &src[i + m.len() - "NARAD_".len()..];
                    rest[..rest.find('"').unwrap()].to_string()
                })
            })
            .collect();
        read.sort();
        read.dedup();
        let mut listed: Vec<String> = super::ENV_NAMES.iter().map(|s| s.to_string()).collect();
        listed.sort();
        assert_eq!(read, listed);
    }
}
