//! `narad-e2e`: multi-node cluster and fault tests against real `narad` processes on
//! loopback ports.
//!
//! [`TestCluster::start`] reserves an API and a cluster port per node, starts every node with
//! the same `--peers` list (`n0@127.0.0.1:<port>,…`), security off (`NARAD_SECURITY_ENABLED`
//! false) unless asked otherwise, and shortened failure detection (heartbeat 250 ms, dead
//! after 3 s instead of 5 s / 30 s, so a test sees a verdict in seconds), then waits until
//! every node answers `/readyz`. Each node is a [`narad_tests::Server`]: kill -9, SIGTERM and
//! restart on the same ports and data dir; its log is printed if the test fails.
//!
//! The chaos helpers ([`load`]) run producers and consumers spread over the nodes with the
//! durability ledger of `narad-tests`, so every test ends with the same verdict: every
//! message that got `202` was consumed at least once (lost = 0), nothing corrupt or foreign.
//!
//! [`power::PowerLab`] puts a node's data dir on its own loop-mounted ext4 image and cuts
//! the power under load: the node is booted on what the image held at that instant, without
//! what only the page cache held (`tests/power_loss.rs`).

pub mod load;
pub mod netns;
pub mod power;

use std::time::Duration;

use narad_tests::server::free_port;
use narad_tests::{eventually, Http, Server, ServerOpts, Value};

/// Whether this process runs as root (the network-namespace and loop-device labs need it).
pub(crate) fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

/// Whether `tool` can be run (asked for its version with `version_flag`).
pub(crate) fn have(tool: &str, version_flag: &str) -> bool {
    std::process::Command::new(tool)
        .arg(version_flag)
        .output()
        .is_ok()
}

/// Whether a test that needs a lab must run here: `false` (and the reason printed) when the
/// machine lacks a prerequisite (`missing`) and the variable `require` is not `1`; panics
/// when it lacks one and the variable is set, as CI sets it.
pub(crate) fn lab_available(test: &str, missing: Option<String>, require: &str) -> bool {
    let Some(why) = missing else {
        return true;
    };
    let required = std::env::var(require).is_ok_and(|v| v == "1");
    assert!(!required, "{require}=1 but {why}");
    eprintln!("{test}: skipped: {why} (install them, or set {require}=1 to fail instead)");
    false
}

/// Runs `argv` (program, then arguments) and returns its standard output; an error, with
/// its exit status and standard error, when it cannot start or fails.
pub(crate) fn run(argv: &[&str]) -> anyhow::Result<String> {
    use anyhow::Context as _;
    let out = std::process::Command::new(argv[0])
        .args(&argv[1..])
        .output()
        .with_context(|| format!("run {}", argv.join(" ")))?;
    if !out.status.success() {
        anyhow::bail!(
            "{} failed ({}): {}",
            argv.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Failure detection used by the tests (the SPEC's is 5 s / 30 s).
pub const HEARTBEAT_MS: u64 = 250;
pub const DEAD_AFTER_MS: u64 = 3000;
/// How long a cluster may take to form or a node to become ready.
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);

pub struct Node {
    pub id: String,
    pub cluster_port: u16,
    pub server: Server,
}

impl Node {
    pub fn url(&self) -> String {
        self.server.url()
    }
    pub fn http(&self) -> Http {
        Http::new(self.server.url())
    }
}

pub struct TestCluster {
    pub nodes: Vec<Node>,
    pub peers: String,
    extra_env: Vec<(String, String)>,
    /// The root admin's credentials when security is on (`NARAD_SECURITY_ENABLED=true` with
    /// `NARAD_ADMIN_PASSWORD`): the helpers that read the cluster view send them.
    admin: Option<(String, String)>,
}

/// The root admin's (username, password) that `env` seeds, when it turns security on.
fn admin_credentials(env: &[(String, String)]) -> Option<(String, String)> {
    let get = |k: &str| {
        env.iter()
            .rev()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
    };
    let secured = get("NARAD_SECURITY_ENABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"));
    let password = get("NARAD_ADMIN_PASSWORD").filter(|p| !p.is_empty())?;
    secured.then(|| ("admin".to_string(), password.to_string()))
}

/// Options for [`TestCluster::start_with`].
#[derive(Default, Clone)]
pub struct ClusterOpts {
    /// Extra environment for every node.
    pub env: Vec<(String, String)>,
    /// Nodes started as initial members (the rest of `size` start join-only later via
    /// [`TestCluster::add_node`]); default all.
    pub seeds: Option<usize>,
    /// Run node i in network namespace `netns[i]` at address `hosts[i]` (ports 7942/7943),
    /// instead of on loopback with free ports (see [`netns::NetLab`]).
    pub hosts: Vec<(String, String)>,
    /// Extra environment for one initial member: (index, name, value).
    pub node_env: Vec<(usize, String, String)>,
    /// Node IDs of the initial members in order (e.g. StatefulSet pod names); default
    /// `n0`, `n1`, ….
    pub ids: Vec<String>,
}

/// Where a node runs: its address, network namespace (if any) and ports.
struct Place {
    host: String,
    netns: Option<String>,
    api: u16,
    cluster: u16,
}

fn node_opts(id: &str, place: &Place, peers: &str, env: &[(String, String)]) -> ServerOpts {
    let mut o = ServerOpts {
        dev: false,
        port: Some(place.api),
        wait_ready: false,
        host: place.host.clone(),
        netns: place.netns.clone(),
        ..ServerOpts::default()
    }
    .arg("--node-id")
    .arg(id)
    .arg("--cluster-addr")
    .arg(format!("{}:{}", place.host, place.cluster))
    .arg("--peers")
    .arg(peers)
    .arg("--log-format")
    .arg("text")
    .env("NARAD_SECURITY_ENABLED", "false")
    .env("NARAD_TEST_HEARTBEAT_MS", HEARTBEAT_MS.to_string())
    .env("NARAD_TEST_DEAD_AFTER_MS", DEAD_AFTER_MS.to_string());
    for (k, v) in env {
        o = o.env(k.clone(), v.clone());
    }
    o
}

impl TestCluster {
    /// Starts `n` initial members and waits until all are ready.
    pub async fn start(n: usize) -> TestCluster {
        TestCluster::start_with(n, ClusterOpts::default()).await
    }

    pub async fn start_with(n: usize, opts: ClusterOpts) -> TestCluster {
        let places: Vec<Place> = (0..n)
            .map(|i| match opts.hosts.get(i) {
                Some((host, ns)) => Place {
                    host: host.clone(),
                    netns: Some(ns.clone()),
                    api: 7942,
                    cluster: 7943,
                },
                None => Place {
                    host: "127.0.0.1".into(),
                    netns: None,
                    api: free_port(),
                    cluster: free_port(),
                },
            })
            .collect();
        let seeds = opts.seeds.unwrap_or(n);
        let ids: Vec<String> = (0..n)
            .map(|i| opts.ids.get(i).cloned().unwrap_or_else(|| format!("n{i}")))
            .collect();
        let peers = places[..seeds]
            .iter()
            .enumerate()
            .map(|(i, p)| format!("{}@{}:{}", ids[i], p.host, p.cluster))
            .collect::<Vec<_>>()
            .join(",");
        let mut nodes = Vec::new();
        for (i, place) in places.iter().enumerate().take(seeds) {
            let id = ids[i].clone();
            let mut env = opts.env.clone();
            env.extend(
                opts.node_env
                    .iter()
                    .filter(|(n, _, _)| *n == i)
                    .map(|(_, k, v)| (k.clone(), v.clone())),
            );
            let server = Server::start(node_opts(&id, place, &peers, &env)).await;
            nodes.push(Node {
                id,
                cluster_port: place.cluster,
                server,
            });
        }
        let c = TestCluster {
            nodes,
            peers,
            admin: admin_credentials(&opts.env),
            extra_env: opts.env,
        };
        for i in 0..c.nodes.len() {
            c.wait_ready(i).await;
        }
        c
    }

    /// Starts a join-only node (not in `--peers`) and waits until it is ready (admitted).
    pub async fn add_node(&mut self) -> usize {
        let i = self.add_node_unready(Vec::new()).await;
        self.wait_ready(i).await;
        i
    }

    /// Starts a join-only node with `env` added (e.g. a wrong cluster secret) and returns as
    /// soon as it serves `/healthz`.
    pub async fn add_node_unready(&mut self, env: Vec<(String, String)>) -> usize {
        let i = self.nodes.len();
        let id = format!("n{i}");
        let place = Place {
            host: "127.0.0.1".into(),
            netns: None,
            api: free_port(),
            cluster: free_port(),
        };
        let mut all_env = self.extra_env.clone();
        all_env.extend(env);
        let server = Server::start(node_opts(&id, &place, &self.peers, &all_env)).await;
        self.nodes.push(Node {
            id,
            cluster_port: place.cluster,
            server,
        });
        i
    }

    /// A client of node `i` that sends no credentials.
    pub fn http(&self, i: usize) -> Http {
        self.nodes[i].http()
    }

    /// A client of node `i` that sends the root admin's credentials when security is on
    /// (no credentials otherwise): what the cluster-view helpers use.
    pub fn admin_http(&self, i: usize) -> Http {
        match &self.admin {
            Some((user, password)) => self.http(i).as_user(user, password),
            None => self.http(i),
        }
    }

    pub fn url(&self, i: usize) -> String {
        self.nodes[i].url()
    }

    /// Waits until node `i` answers `/readyz` 200.
    pub async fn wait_ready(&self, i: usize) {
        let http = self.http(i);
        eventually(READY_TIMEOUT, Duration::from_millis(50), || {
            let http = http.clone();
            async move {
                match http
                    .request(narad_tests::Method::GET, "/readyz")
                    .timeout(Duration::from_secs(2))
                    .try_send()
                    .await
                {
                    Ok(r) if r.status == 200 => Ok(()),
                    Ok(r) => Err(anyhow::anyhow!("node {i} not ready: {}", r.describe())),
                    Err(e) => Err(anyhow::anyhow!("node {i} not reachable: {e}")),
                }
            }
        })
        .await;
    }

    pub fn kill9(&mut self, i: usize) {
        self.nodes[i].server.kill9();
    }

    /// Restarts node `i` on its ports and data dir (kill -9 first if running); does not wait
    /// for readiness (a node may restart while the cluster has no quorum).
    pub async fn restart(&mut self, i: usize) {
        self.nodes[i].server.restart().await;
    }

    /// `GET /v1/cluster/members` as seen by node `i`.
    pub async fn members(&self, i: usize) -> Vec<Value> {
        let v = self
            .admin_http(i)
            .get("/v1/cluster/members")
            .await
            .expect_json(200);
        v["members"].as_array().cloned().unwrap_or_default()
    }

    /// Starts decommissioning member `id` through node `via` (as admin); asserts `204`.
    pub async fn decommission(&self, via: usize, id: &str) {
        let r = self
            .admin_http(via)
            .request(
                narad_tests::Method::POST,
                format!("/v1/cluster/members/{id}/decommission"),
            )
            .send()
            .await;
        assert_eq!(r.status, 204, "decommission {id}: {}", r.describe());
    }

    /// The `field` array of `GET path` on node `via`; empty when the node does not answer
    /// `200` within 3 s (it may be down or restarting).
    pub async fn list_or_empty(&self, via: usize, path: &str, field: &str) -> Vec<Value> {
        match self
            .admin_http(via)
            .request(narad_tests::Method::GET, path)
            .timeout(Duration::from_secs(3))
            .try_send()
            .await
        {
            Ok(r) if r.status == 200 => serde_json::from_slice::<Value>(&r.body)
                .ok()
                .and_then(|v| v[field].as_array().cloned())
                .unwrap_or_default(),
            _ => Vec::new(),
        }
    }

    /// Moves in flight (`GET /v1/cluster/moves`) as node `via` sees them.
    pub async fn moves(&self, via: usize) -> Vec<Value> {
        self.list_or_empty(via, "/v1/cluster/moves", "moves").await
    }

    /// The index of the node the others report as metadata leader, as seen by node `via`.
    pub async fn leader(&self, via: usize) -> Option<usize> {
        let members = self.members(via).await;
        let id = members
            .iter()
            .find(|m| m["leader"].as_bool() == Some(true))?["id"]
            .as_str()?
            .to_string();
        self.nodes.iter().position(|n| n.id == id)
    }

    /// Waits until node `via` sees member `id` with `status`.
    pub async fn wait_status(&self, via: usize, id: &str, status: &str) {
        let http = self.admin_http(via);
        let (id, status) = (id.to_string(), status.to_string());
        eventually(READY_TIMEOUT, Duration::from_millis(100), || {
            let (http, id, status) = (http.clone(), id.clone(), status.clone());
            async move {
                let r = http
                    .request(narad_tests::Method::GET, "/v1/cluster/members")
                    .timeout(Duration::from_secs(2))
                    .try_send()
                    .await?;
                let v: Value = serde_json::from_slice(&r.body)?;
                let seen = v["members"].as_array().is_some_and(|ms| {
                    ms.iter()
                        .any(|m| m["id"] == id.as_str() && m["status"] == status.as_str())
                });
                anyhow::ensure!(seen, "member {id} not {status} yet: {v}");
                Ok(())
            }
        })
        .await;
    }

    /// The owner of every partition of `topic` as node `via` reports it.
    pub async fn owners(&self, via: usize, topic: &str) -> Vec<String> {
        let v = self
            .admin_http(via)
            .get(format!("/v1/topics/{topic}"))
            .await
            .expect_json(200);
        v["partition_stats"]
            .as_array()
            .expect("partition_stats")
            .iter()
            .map(|p| p["owner_node"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    pub fn index_of(&self, id: &str) -> usize {
        self.nodes
            .iter()
            .position(|n| n.id == id)
            .unwrap_or_else(|| panic!("no node {id}"))
    }
}
