//! `narad-operator`: `run` (default) reconciles NaradCluster, Topic, User and Grant
//! resources; `crdgen` writes the CRDs (`crds/*.yaml`, or stdout).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use narad_operator::crd::{all_crds, crd_yaml};
use narad_operator::leader::LeaderElector;
use narad_operator::reconcile::Context;
use narad_operator::resources::{parse_minor, pdb_api_version};

#[derive(Parser)]
#[command(
    name = "narad-operator",
    version,
    about = "Kubernetes operator for Narad",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    /// `run`'s options, when no subcommand is given.
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the controllers (the default).
    Run(RunArgs),
    /// GET an http URL and exit 0 on a 2xx answer (the chart's `helm test`: the image has
    /// no other HTTP client).
    Probe {
        /// e.g. http://narad-operator-metrics:8080/healthz
        url: String,
    },
    /// Write the CRDs as YAML.
    Crdgen {
        /// Directory to write one file per CRD into; without it, all go to stdout.
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

#[derive(clap::Args, Default)]
struct RunArgs {
    /// Watch only this namespace (default: all).
    #[arg(long, env = "NARAD_OPERATOR_NAMESPACE")]
    namespace: Option<String>,
    /// Broker base URL for every cluster instead of its client Service (spec.endpoint wins).
    #[arg(long, env = "NARAD_OPERATOR_BROKER_ENDPOINT")]
    broker_endpoint: Option<String>,
    /// Let NaradClusters with `spec.allowExternalEndpoint: true` point the operator at any
    /// endpoint (it sends their admin credentials there). Off: only their own client
    /// Services, whatever the NaradClusters say.
    #[arg(long, env = "NARAD_OPERATOR_ALLOW_EXTERNAL_ENDPOINTS")]
    allow_external_endpoints: bool,
    /// Cluster DNS domain for client Service URLs and peer addresses.
    #[arg(long, env = "NARAD_OPERATOR_CLUSTER_DOMAIN")]
    cluster_domain: Option<String>,
    /// Drift-correction period (e.g. 5m, 30s).
    #[arg(long, env = "NARAD_OPERATOR_RESYNC", default_value = "5m")]
    resync: String,
    /// Run without leader election (a single replica).
    #[arg(long)]
    no_leader_election: bool,
    /// Name of the Lease.
    #[arg(
        long,
        env = "NARAD_OPERATOR_LEASE_NAME",
        default_value = "narad-operator"
    )]
    lease_name: String,
    /// Namespace of the Lease (default: POD_NAMESPACE, else `default`).
    #[arg(long, env = "POD_NAMESPACE")]
    lease_namespace: Option<String>,
    /// This replica's identity in the Lease (default: POD_NAME, else the hostname).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Where to serve GET /metrics and /healthz (empty: nowhere).
    #[arg(
        long,
        env = "NARAD_OPERATOR_METRICS_ADDR",
        default_value = "0.0.0.0:8080"
    )]
    metrics_addr: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Some(Cmd::Crdgen { out }) => crdgen(out),
        Some(Cmd::Probe { url }) => probe(&url).await,
        Some(Cmd::Run(args)) => run(args).await,
        None => run(cli.run).await,
    }
}

async fn probe(url: &str) -> anyhow::Result<()> {
    let client = reqwest::Client::builder()
        .tls_backend_preconfigured(narad_api::client::tls_config(None)?)
        .timeout(std::time::Duration::from_secs(10))
        .build()?;
    let r = client.get(url).send().await?;
    let status = r.status();
    let body = r.text().await.unwrap_or_default();
    anyhow::ensure!(status.is_success(), "{url}: {status}: {}", body.trim());
    println!("{url}: {status}: {}", body.trim());
    Ok(())
}

fn crdgen(out: Option<PathBuf>) -> anyhow::Result<()> {
    match out {
        None => {
            for (_, crd) in all_crds() {
                print!("---\n{}", crd_yaml(&crd));
            }
        }
        Some(dir) => {
            std::fs::create_dir_all(&dir)?;
            for (file, crd) in all_crds() {
                let p = dir.join(file);
                std::fs::write(&p, crd_yaml(&crd))
                    .with_context(|| format!("writing {}", p.display()))?;
            }
        }
    }
    Ok(())
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,kube=warn".into()),
        )
        .json()
        .init();
    let client = kube::Client::try_default()
        .await
        .context("kubernetes client")?;
    let info = client.apiserver_version().await.context("server version")?;
    let pdb = pdb_api_version(parse_minor(&info.minor).unwrap_or(99));
    tracing::info!(server = %info.git_version, pdb, "connected");

    let identity = args
        .identity
        .or_else(hostname_or_none)
        .unwrap_or_else(|| format!("narad-operator-{}", std::process::id()));
    let mut ctx = Context::new(client.clone());
    ctx.reporter = narad_operator::reconcile::reporter(Some(identity.clone()));
    ctx.allow_external_endpoints = args.allow_external_endpoints;
    if args.allow_external_endpoints {
        tracing::warn!("external endpoints allowed: NaradClusters with spec.allowExternalEndpoint choose where their admin credentials go");
    }
    ctx.broker_endpoint = args.broker_endpoint;
    ctx.cluster_domain = args.cluster_domain;
    ctx.resync = narad_api::duration::parse_human_duration(&args.resync)
        .map_err(|e| anyhow::anyhow!("--resync: {e}"))?
        .max(Duration::from_secs(1));
    ctx.pdb_api_version = pdb.to_string();
    let ctx = Arc::new(ctx);
    if !args.metrics_addr.is_empty() {
        let l = tokio::net::TcpListener::bind(&args.metrics_addr)
            .await
            .with_context(|| format!("--metrics-addr {}", args.metrics_addr))?;
        tracing::info!(addr = %args.metrics_addr, "serving /metrics and /healthz");
        tokio::spawn(narad_operator::metrics::serve(l, ctx.metrics.clone()));
    }

    if args.no_leader_election {
        ctx.metrics.leader.set(1);
        narad_operator::run::controllers(ctx, args.namespace).await;
        return Ok(());
    }
    let lease_ns = args.lease_namespace.unwrap_or_else(|| "default".into());
    let elector = LeaderElector::new(
        Api::<Lease>::namespaced(client, &lease_ns),
        &args.lease_name,
        &identity,
    );
    tracing::info!(%identity, lease = %args.lease_name, "waiting for leadership");
    elector.acquire().await;
    tracing::info!(%identity, "leading");
    ctx.metrics.leader.set(1);
    tokio::select! {
        _ = narad_operator::run::controllers(ctx, args.namespace) => Ok(()),
        _ = elector.hold() => anyhow::bail!("lost leadership"),
    }
}

fn hostname_or_none() -> Option<String> {
    std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn external_endpoints_are_off_unless_switched_on() {
        let run = |argv: &[&str]| match Cli::try_parse_from(argv).unwrap().cmd {
            Some(Cmd::Run(a)) => a.allow_external_endpoints,
            _ => unreachable!(),
        };
        assert!(!run(&["narad-operator", "run"]));
        assert!(run(&[
            "narad-operator",
            "run",
            "--allow-external-endpoints"
        ]));
        // The chart sets the environment variable to "true" (this test alone reads it).
        std::env::set_var("NARAD_OPERATOR_ALLOW_EXTERNAL_ENDPOINTS", "true");
        assert!(run(&["narad-operator", "run"]));
        std::env::set_var("NARAD_OPERATOR_ALLOW_EXTERNAL_ENDPOINTS", "false");
        assert!(!run(&["narad-operator", "run"]));
        std::env::remove_var("NARAD_OPERATOR_ALLOW_EXTERNAL_ENDPOINTS");
    }
}
