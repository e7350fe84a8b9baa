//! The client commands of `narad` (SPEC §7.2): topic, pub, sub, replay, bench, ctx, user,
//! cluster, server report. Built on `narad_api::client`.

/// Client subcommands, flattened into the `narad` binary's top level.
#[derive(Debug, clap::Subcommand)]
pub enum Command {}

/// Arguments of `narad server report`.
#[derive(Debug, clap::Args)]
pub struct ReportArgs {}

/// Runs one client command.
pub async fn run(cmd: Command) -> anyhow::Result<()> {
    match cmd {}
}

/// Runs `narad server report`.
pub async fn server_report(args: ReportArgs) -> anyhow::Result<()> {
    let _ = args;
    anyhow::bail!("not implemented")
}
