//! The one `narad` binary: `server start` and the client commands.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// mimalloc: the request path allocates small buffers per request; glibc malloc showed up at
/// about 10% of the broker's CPU under load.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
use narad::config::{Config, ServerArgs};

#[derive(Parser)]
#[command(
    name = "narad",
    version,
    about = "Narad: a queue-first message broker over plain HTTP"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run or inspect the server.
    Server {
        #[command(subcommand)]
        cmd: ServerCmd,
    },
    /// Alias of `server start`.
    Serve(ServerArgs),
    /// Print the version.
    Version,
    /// Print a shell completion script (e.g. `source <(narad completion bash)`).
    Completion {
        /// The shell
        shell: clap_complete::Shell,
    },
    #[command(flatten)]
    Client(narad_cli::Command),
}

#[derive(Subcommand)]
enum ServerCmd {
    /// Start a node.
    Start(ServerArgs),
    /// Per topic: partitions, messages, size, owner spread.
    Report(narad_cli::ReportArgs),
}

/// The command line: [`Cli`] plus the connection flags written before the subcommand
/// (`narad -s URL -u admin topic ls`, as Go Narad's CLI takes them).
fn command() -> clap::Command {
    use clap::CommandFactory;
    Cli::command().args(narad_cli::conn::leading_args())
}

fn main() -> ExitCode {
    use clap::FromArgMatches;
    let matches = command().get_matches();
    let parsed = Cli::from_arg_matches(&matches)
        .and_then(|cli| Ok((cli, narad_cli::ConnArgs::from_arg_matches(&matches)?)));
    let (cli, leading) = match parsed {
        Ok(v) => v,
        Err(e) => e.exit(),
    };
    if let Cmd::Completion { shell } = cli.cmd {
        let mut script = Vec::new();
        clap_complete::generate(shell, &mut command(), "narad", &mut script);
        // A closed pipe (`| head`) is the reader's choice, not a failure.
        let _ = std::io::Write::write_all(&mut std::io::stdout(), &script);
        return ExitCode::SUCCESS;
    }
    if matches!(
        cli.cmd,
        Cmd::Server {
            cmd: ServerCmd::Start(_)
        } | Cmd::Serve(_)
            | Cmd::Version
    ) && !leading.is_empty()
    {
        return fail(&anyhow::anyhow!(
            "connection flags (-s, -u, -p, --ca-file) apply to client commands, not to this one"
        ));
    }
    let workers = match narad::config::Tuning::worker_threads_from(&|k| std::env::var(k).ok()) {
        Ok(n) => n,
        Err(e) => return fail(&e.into()),
    };
    let wal_inline = match narad::config::Tuning::wal_inline_from(&|k| std::env::var(k).ok()) {
        Ok(b) => b,
        Err(e) => return fail(&e.into()),
    };
    // With one worker, the runtime's thread is the worker: it writes the WAL's first lane
    // whenever it runs out of work (`narad::wal::flush_parked`).
    let mut builder = if workers == 1 && wal_inline {
        narad::wal::flush_at_park();
        let mut b = tokio::runtime::Builder::new_current_thread();
        b.on_thread_park(narad::wal::flush_parked);
        b
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(workers);
        b
    };
    let rt = match builder.enable_all().thread_name("narad").build() {
        Ok(rt) => rt,
        Err(e) => return fail(&anyhow::anyhow!("cannot start the runtime: {e}")),
    };
    let result = rt.block_on(async move {
        match cli.cmd {
            Cmd::Server {
                cmd: ServerCmd::Start(args),
            }
            | Cmd::Serve(args) => serve(args).await,
            Cmd::Server {
                cmd: ServerCmd::Report(args),
            } => narad_cli::server_report(args, &leading).await,
            Cmd::Version => {
                println!("narad {}", narad::node::VERSION);
                Ok(())
            }
            Cmd::Client(cmd) => narad_cli::run(cmd, &leading).await,
            Cmd::Completion { .. } => Ok(()),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&e),
    }
}

fn fail(e: &anyhow::Error) -> ExitCode {
    eprintln!("narad: {e:#}");
    ExitCode::FAILURE
}

async fn serve(args: ServerArgs) -> anyhow::Result<()> {
    let names: Vec<String> = std::env::vars_os()
        .filter_map(|(k, _)| k.into_string().ok())
        .collect();
    let env_names = narad::config::check_env_names(names.iter().map(String::as_str))?;
    let config = Config::load(&args, &|k| std::env::var(k).ok())?;
    narad::telemetry::init(&config.log.level, &config.log.format);
    if !env_names.ignored.is_empty() {
        tracing::info!(names = ?env_names.ignored, "NARAD_* variables that are no setting of the server, left to whoever set them");
    }
    if !config.security.enabled && !config.dev {
        tracing::warn!("security is off: every request is allowed");
    }
    let running = narad::node::start(config.clone()).await?;
    if config.dev {
        eprintln!(
            "\n  narad {} (dev: security off, data in {})\n  listening on http://{}\n\n  try:\n    curl -X POST http://{addr}/v1/topics -d '{{\"name\":\"orders\"}}'\n    curl -X POST http://{addr}/v1/topics/orders/produce -d 'hello'\n    curl 'http://{addr}/v1/topics/orders/consume?wait=5s'\n",
            narad::node::VERSION,
            config.storage.data_dir.display(),
            running.addr,
            addr = running.addr,
        );
    }
    wait_for_signal().await;
    running.shutdown().await
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term =
        signal(SignalKind::terminate()).expect("invariant: installing a SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("invariant: installing a SIGINT handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
