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

pub use cluster::ReportArgs;
pub use conn::ConnArgs;

/// Client subcommands, flattened into the `narad` binary's top level.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Manage topics
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

/// Runs one client command.
pub async fn run(cmd: Command) -> anyhow::Result<()> {
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
pub async fn server_report(args: ReportArgs) -> anyhow::Result<()> {
    cluster::report(args).await
}

#[cfg(test)]
mod cli_tests;
