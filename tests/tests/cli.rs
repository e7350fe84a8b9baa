//! The `narad` client commands (SPEC §7, §7.2), run as real processes against a dev server:
//! topic add/info/ls, pub (argument, file, stdin, count), sub, replay, bench, ctx, version,
//! and the error convention (exit 1, `narad: <message>` on stderr, HTTP errors as
//! `http <code>: <server message>`).
//!
//! Every command runs with the inherited `NARAD_*` environment removed and
//! `NARAD_CONFIG_DIR` pointing at a fresh temp dir, so neither the machine's contexts nor its
//! environment can leak in; client commands get `--server <url>` unless a test is about
//! contexts.

use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use narad_tests::*;
use tempfile::TempDir;
use tokio::io::AsyncWriteExt;

/// No client command of these tests should take this long.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs `narad` client commands with a private config dir.
struct Cli {
    server: String,
    config: TempDir,
}

/// A finished command.
struct Out {
    cmd: String,
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl Out {
    fn describe(&self) -> String {
        format!(
            "`{}` -> {}\n--- stdout ---\n{}--- stderr ---\n{}",
            self.cmd, self.status, self.stdout, self.stderr
        )
    }

    /// Panics unless the command exited 0.
    #[track_caller]
    fn ok(self) -> Out {
        assert!(self.status.success(), "{}", self.describe());
        self
    }

    /// Panics unless the command failed as SPEC §7 says (exit 1, stdout empty, stderr one
    /// line starting with `narad: <prefix>`); returns stderr.
    #[track_caller]
    fn failed(self, prefix: &str) -> String {
        assert_eq!(self.status.code(), Some(1), "{}", self.describe());
        assert!(
            self.stderr.starts_with(&format!("narad: {prefix}"))
                && self.stderr.lines().count() == 1,
            "want one stderr line starting with `narad: {prefix}`: {}",
            self.describe()
        );
        assert!(self.stdout.is_empty(), "{}", self.describe());
        self.stderr
    }

    fn lines(&self) -> Vec<&str> {
        self.stdout.lines().collect()
    }
}

impl Cli {
    /// `server`: the base URL client commands get with `--server`.
    fn new(server: String) -> Cli {
        Cli {
            server,
            config: tempfile::Builder::new()
                .prefix("narad-cli-")
                .tempdir()
                .expect("tempdir"),
        }
    }

    fn contexts_file(&self) -> std::path::PathBuf {
        self.config.path().join("contexts.json")
    }

    /// A client command against the test server (`--server` appended).
    async fn client(&self, args: &[&str]) -> Out {
        let mut all = args.to_vec();
        all.extend(["--server", self.server.as_str()]);
        self.run(&all, None, &[]).await
    }

    /// `narad <args>` with `stdin` (else /dev/null) and extra environment.
    async fn run(&self, args: &[&str], stdin: Option<&[u8]>, env: &[(&str, &str)]) -> Out {
        let mut cmd = tokio::process::Command::new(narad_bin());
        cmd.args(args);
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("NARAD_") {
                cmd.env_remove(&k);
            }
        }
        cmd.env("NARAD_CONFIG_DIR", self.config.path())
            .envs(env.iter().copied())
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let shown = format!("narad {}", args.join(" "));
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {shown}: {e}"));
        if let Some(bytes) = stdin {
            let mut w = child.stdin.take().expect("piped stdin");
            w.write_all(bytes).await.expect("write stdin");
            drop(w);
        }
        let out = tokio::time::timeout(COMMAND_TIMEOUT, child.wait_with_output())
            .await
            .unwrap_or_else(|_| panic!("`{shown}` did not finish within {COMMAND_TIMEOUT:?}"))
            .unwrap_or_else(|e| panic!("`{shown}`: {e}"));
        Out {
            cmd: shown,
            status: out.status,
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

/// The value of a `key: value` line of `topic info`.
fn info_field<'a>(out: &'a Out, key: &str) -> &'a str {
    out.stdout
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .map(str::trim)
        .unwrap_or_else(|| panic!("no `{key}:` line\n{}", out.describe()))
}

/// Whitespace-separated cells of the table row whose first cell is `first`.
fn table_row<'a>(out: &'a Out, first: &str) -> Vec<&'a str> {
    out.stdout
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|cells| cells.first() == Some(&first))
        .unwrap_or_else(|| panic!("no table row {first:?}\n{}", out.describe()))
}

#[tokio::test]
async fn version_prints_the_version() {
    let out = Cli::new(String::new())
        .run(&["version"], None, &[])
        .await
        .ok();
    assert_eq!(
        out.stdout,
        format!("narad {}\n", env!("CARGO_PKG_VERSION")),
        "{}",
        out.describe()
    );
}

#[tokio::test]
async fn topic_add_info_and_ls() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    let cli = Cli::new(server.url());

    let out = cli
        .client(&[
            "topic",
            "add",
            "cli-orders",
            "--partitions",
            "4",
            "--retention",
            "12h",
            "--visibility",
            "10s",
        ])
        .await
        .ok();
    assert!(
        out.stdout
            .starts_with("created topic cli-orders (4 partitions, retention 12h, visibility 10s"),
        "{}",
        out.describe()
    );
    let rec = http.get_topic("cli-orders", "").await;
    assert_eq!(
        (
            &rec["partitions"],
            &rec["retention_ms"],
            &rec["visibility_timeout_ms"]
        ),
        (&json!(4), &json!(43_200_000), &json!(10_000)),
        "{rec}"
    );

    http.produce_ok("cli-orders", "partition=2", "x").await;
    http.wait_visible("cli-orders", 2, 1).await;
    let info = cli.client(&["topic", "info", "cli-orders"]).await.ok();
    assert_eq!(info_field(&info, "name"), "cli-orders");
    assert_eq!(info_field(&info, "partitions"), "4");
    assert_eq!(info_field(&info, "retention"), "12h");
    assert_eq!(info_field(&info, "visibility timeout"), "10s");
    assert!(table_row(&info, "PARTITION").contains(&"WATERMARK"));
    for p in 0..4 {
        let row = table_row(&info, &p.to_string());
        // PARTITION OWNER STATUS OLDEST NEXT HIGH-WATERMARK MESSAGES …
        let want_hwm = if p == 2 { "1" } else { "0" };
        assert_eq!(
            (row[2], row[5], row[6]),
            ("ok", want_hwm, want_hwm),
            "partition {p}\n{}",
            info.describe()
        );
    }
    assert!(
        info.stdout.contains("\n1 retained messages, "),
        "{}",
        info.describe()
    );

    let ls = cli.client(&["topic", "ls", "--json"]).await.ok();
    let list: Value = serde_json::from_str(&ls.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e})\n{}", ls.describe()));
    let t = list
        .as_array()
        .and_then(|a| a.iter().find(|t| t["name"] == "cli-orders"))
        .unwrap_or_else(|| panic!("cli-orders not listed\n{}", ls.describe()));
    assert_eq!(
        (
            &t["partitions"],
            &t["retention_ms"],
            &t["visibility_timeout_ms"]
        ),
        (&json!(4), &json!(43_200_000), &json!(10_000)),
        "{t}"
    );
    let ls = cli.client(&["topic", "ls"]).await.ok();
    assert_eq!(
        table_row(&ls, "cli-orders")[1..4],
        ["4", "12h", "10s"],
        "{}",
        ls.describe()
    );
}

#[tokio::test]
async fn errors_exit_1_with_the_message_on_stderr() {
    let server = Server::start_default().await;
    let cli = Cli::new(server.url());
    cli.client(&["topic", "info", "nosuch"])
        .await
        .failed("http 404: ");
    cli.client(&["topic", "add", "dup"]).await.ok();
    cli.client(&["topic", "add", "dup"])
        .await
        .failed("http 409: ");
    cli.client(&["topic", "add", "short", "--retention", "1m"])
        .await
        .failed("http 400: ");
    cli.client(&["topic", "add", "bad", "--retention", "soon"])
        .await
        .failed("invalid retention");
    cli.client(&["pub", "nosuch", "hello"])
        .await
        .failed("http 404: ");
    let refused = cli
        .run(
            &["topic", "ls", "--server", "http://127.0.0.1:1"],
            None,
            &[],
        )
        .await;
    refused.failed("");
}

#[tokio::test]
async fn pub_sub_and_replay() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    let cli = Cli::new(server.url());
    cli.client(&["topic", "add", "cli-pub"]).await.ok();

    // One message each from the argument, a file and stdin, then 50 copies.
    cli.client(&["pub", "cli-pub", "hello-arg", "--partition", "0"])
        .await
        .ok();
    let file = cli.config.path().join("msg.json");
    std::fs::write(&file, r#"{"n": 1}"#).unwrap();
    cli.client(&[
        "pub",
        "cli-pub",
        "--file",
        file.to_str().unwrap(),
        "--partition",
        "0",
    ])
    .await
    .ok();
    let mut args = vec!["pub", "cli-pub", "--partition", "0", "--server"];
    args.push(&cli.server);
    cli.run(&args, Some(b"from-stdin"), &[]).await.ok();
    let many = cli
        .client(&[
            "pub",
            "cli-pub",
            "many",
            "--count",
            "50",
            "--partition",
            "0",
        ])
        .await
        .ok();
    assert!(
        many.stderr.contains("published 50 messages"),
        "{}",
        many.describe()
    );
    http.wait_visible("cli-pub", 0, 53).await;
    // With attributes (sent as a batch of one), shown by sub beside the key.
    cli.client(&[
        "pub",
        "cli-pub",
        "with-attrs",
        "--partition",
        "1",
        "--attr",
        "Traceparent=00-1-2-01",
    ])
    .await
    .ok();
    let sub = cli
        .client(&["sub", "cli-pub", "--partition", "1", "--count", "1"])
        .await
        .ok();
    assert!(
        sub.stdout.contains(r#"traceparent="00-1-2-01" with-attrs"#),
        "{}",
        sub.describe()
    );
    // With a delay: accepted at once, consumable only after it.
    let sent = std::time::Instant::now();
    cli.client(&[
        "pub",
        "cli-pub",
        "delayed-one",
        "--partition",
        "2",
        "--delay",
        "1500ms",
    ])
    .await
    .ok();
    http.consume_none("cli-pub", "partition=2&wait=0").await;
    let sub = cli
        .client(&[
            "sub",
            "cli-pub",
            "--partition",
            "2",
            "--count",
            "1",
            "--raw",
        ])
        .await
        .ok();
    assert!(sub.stdout.contains("delayed-one"), "{}", sub.describe());
    assert!(sent.elapsed() >= Duration::from_millis(1500));
    let mut want: Vec<String> = vec![
        "hello-arg".into(),
        r#"{"n": 1}"#.into(),
        "from-stdin".into(),
    ];
    want.extend(std::iter::repeat_n("many".to_string(), 50));

    // sub prints the decoded payloads in offset order and acks them.
    let sub = cli
        .client(&["sub", "cli-pub", "--count", "53", "--raw"])
        .await
        .ok();
    assert_eq!(sub.lines(), want, "{}", sub.describe());
    http.consume_none("cli-pub", "wait=0").await;

    // replay prints the history, acked or not.
    let replay = cli
        .client(&["replay", "cli-pub", "--partition", "0", "--raw"])
        .await
        .ok();
    assert_eq!(replay.lines(), want, "{}", replay.describe());
    let replay = cli
        .client(&[
            "replay",
            "cli-pub",
            "--partition",
            "0",
            "--from",
            "1",
            "--to",
            "3",
        ])
        .await
        .ok();
    let lines = replay.lines();
    assert_eq!(lines.len(), 2, "{}", replay.describe());
    assert!(
        lines[0].starts_with("cli-pub/0@1 ") && lines[0].ends_with(r#" {"n": 1}"#),
        "{}",
        replay.describe()
    );
    assert!(
        lines[1].starts_with("cli-pub/0@2 ") && lines[1].ends_with(" from-stdin"),
        "{}",
        replay.describe()
    );
}

#[tokio::test]
async fn bench_reports_throughput_and_percentiles() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    let cli = Cli::new(server.url());
    let out = cli
        .client(&["bench", "cli-bench", "--count", "2000", "--consume"])
        .await
        .ok();
    for phase in ["produce:", "consume:"] {
        let line = out
            .stdout
            .lines()
            .find(|l| l.starts_with(phase))
            .unwrap_or_else(|| panic!("no {phase} line\n{}", out.describe()));
        for want in ["2000 msgs", "msg/s", "p50 ", "p95 ", "p99 "] {
            assert!(line.contains(want), "{phase} line lacks {want:?}: {line}");
        }
    }
    http.wait_total_visible("cli-bench", 2000).await;
    http.consume_none("cli-bench", "wait=0").await;
}

#[cfg(unix)]
fn mode(p: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .permissions()
        .mode()
        & 0o777
}

#[cfg(unix)]
#[tokio::test]
async fn contexts_add_select_ls_rm() {
    let server = Server::start_default().await;
    let http = Http::new(server.url());
    http.create_topic_named("via-ctx").await;
    let cli = Cli::new(server.url());
    let file = cli.contexts_file();
    let run = |args: &'static [&'static str]| cli.run(args, None, &[]);

    cli.run(&["ctx", "add", "local", "--server", &cli.server], None, &[])
        .await
        .ok();
    assert_eq!(mode(&file), 0o600, "contexts file mode");
    run(&[
        "ctx",
        "add",
        "other",
        "--server",
        "http://127.0.0.1:1",
        "--user",
        "bob",
        "--password",
        "hunter2",
    ])
    .await
    .ok();
    assert_eq!(mode(&file), 0o600, "contexts file mode after an update");

    let ls = run(&["ctx", "ls"]).await.ok();
    assert!(
        ls.stdout.contains("local") && ls.stdout.contains(&cli.server),
        "{}",
        ls.describe()
    );
    assert!(ls.stdout.contains("other"), "{}", ls.describe());
    assert!(
        !ls.stdout.contains("hunter2"),
        "ctx ls must not print passwords\n{}",
        ls.describe()
    );

    // After `ctx select`, client commands without flags go to the context's server.
    run(&["ctx", "select", "nosuch"])
        .await
        .failed("no context named");
    run(&["ctx", "select", "local"]).await.ok();
    assert_eq!(mode(&file), 0o600);
    let ls = run(&["ctx", "ls"]).await.ok();
    let marked: Vec<&str> = ls.lines().into_iter().filter(|l| l.contains('*')).collect();
    assert!(
        marked.len() == 1 && marked[0].contains("local"),
        "the selected context is marked\n{}",
        ls.describe()
    );
    let topics = run(&["topic", "ls", "--json"]).await.ok();
    assert!(
        topics.stdout.contains("\"via-ctx\""),
        "{}",
        topics.describe()
    );
    // The environment beats the context, the flag beats the environment.
    cli.run(
        &["topic", "ls"],
        None,
        &[("NARAD_ADDR", "http://127.0.0.1:1")],
    )
    .await
    .failed("");
    cli.run(
        &["topic", "ls", "--json", "--server", &cli.server],
        None,
        &[("NARAD_ADDR", "http://127.0.0.1:1")],
    )
    .await
    .ok();

    run(&["ctx", "rm", "other"]).await.ok();
    let ls = run(&["ctx", "ls"]).await.ok();
    assert!(!ls.stdout.contains("other"), "{}", ls.describe());
    assert_eq!(mode(&file), 0o600);
    let saved: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(saved["current"], "local", "{saved}");
    assert_eq!(saved["contexts"]["local"]["server"], json!(cli.server));
    run(&["ctx", "rm", "local"]).await.ok();
    run(&["ctx", "rm", "local"]).await.failed("");
}

/// The habits of Go Narad's CLI: connection flags before the subcommand, `topics`,
/// passwords from stdin (the connection's, a new user's), and `completion`.
#[tokio::test]
async fn go_cli_habits_leading_flags_topics_alias_password_stdin_and_completion() {
    let server = Server::start(ServerOpts::secured("cli-admin-pw")).await;
    let url = server.url();
    let cli = Cli::new(url.clone());
    // Connection flags before the subcommand, after it, and mixed (the later one wins).
    cli.run(
        &[
            "-s",
            &url,
            "-u",
            "admin",
            "-p",
            "cli-admin-pw",
            "topic",
            "add",
            "lead",
        ],
        None,
        &[],
    )
    .await
    .ok();
    let ls = cli
        .run(
            &[
                "-s",
                &url,
                "-u",
                "admin",
                "topics",
                "ls",
                "-p",
                "cli-admin-pw",
            ],
            None,
            &[],
        )
        .await
        .ok();
    table_row(&ls, "lead");
    cli.run(
        &[
            "-s",
            &url,
            "-u",
            "admin",
            "-p",
            "wrong",
            "topic",
            "ls",
            "-p",
            "cli-admin-pw",
        ],
        None,
        &[],
    )
    .await
    .ok();
    cli.run(
        &["-s", &url, "-u", "admin", "-p", "wrong", "topic", "ls"],
        None,
        &[],
    )
    .await
    .failed("http 401");
    // --password-stdin: the first line of stdin, nothing in the process list.
    cli.run(
        &[
            "-s",
            &url,
            "-u",
            "admin",
            "--password-stdin",
            "topic",
            "info",
            "lead",
        ],
        Some(b"cli-admin-pw\n"),
        &[],
    )
    .await
    .ok();
    cli.run(
        &[
            "user",
            "add",
            "bob",
            "--user-password-stdin",
            "-g",
            "consume:lead",
            "-s",
            &url,
            "-u",
            "admin",
            "-p",
            "cli-admin-pw",
        ],
        Some(b"bobs-password\n"),
        &[],
    )
    .await
    .ok();
    cli.run(
        &[
            "topic",
            "info",
            "lead",
            "-s",
            &url,
            "-u",
            "bob",
            "--password-stdin",
        ],
        Some(b"bobs-password\n"),
        &[],
    )
    .await
    .ok();
    // One password per stdin.
    cli.run(
        &[
            "user",
            "add",
            "eve",
            "--user-password-stdin",
            "-s",
            &url,
            "-u",
            "admin",
            "--password-stdin",
        ],
        Some(b"cli-admin-pw\nx\n"),
        &[],
    )
    .await
    .failed("stdin can carry one password");
    cli.run(
        &["topic", "ls", "-s", &url, "-u", "admin", "--password-stdin"],
        Some(b""),
        &[],
    )
    .await
    .failed("--password-stdin: stdin held no password");
    // Leading connection flags are refused where they mean nothing.
    cli.run(&["-s", &url, "version"], None, &[])
        .await
        .failed("connection flags");
    // Completion scripts for the three shells name the subcommands.
    for shell in ["bash", "zsh", "fish"] {
        let out = cli.run(&["completion", shell], None, &[]).await.ok();
        assert!(
            out.stdout.contains("topic") && out.stdout.contains("pub"),
            "{}",
            out.describe()
        );
    }
    cli.run(&["completion", "tcsh"], None, &[]).await;
}

/// `narad serve --port/--cluster-port` as Go Narad's `serve` takes them.
#[tokio::test]
async fn serve_takes_port_flags() {
    let (port, cluster_port) = (
        narad_tests::server::free_port(),
        narad_tests::server::free_port(),
    );
    let dir = tempfile::tempdir().unwrap();
    let mut child = tokio::process::Command::new(narad_bin())
        .args([
            "serve",
            "--dev",
            "--port",
            &port.to_string(),
            "--cluster-port",
            &cluster_port.to_string(),
        ])
        .args(["--advertise-addr", "narad-0.narad-headless.apps.svc:7942"])
        .arg("--data-dir")
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let http = Http::new(format!("http://127.0.0.1:{port}"));
    eventually(
        Duration::from_secs(30),
        Duration::from_millis(50),
        || async {
            match http.request(Method::GET, "/readyz").try_send().await {
                Ok(r) if r.status == 200 => Ok(()),
                other => anyhow::bail!("serve --port: /readyz {:?}", other.map(|r| r.status)),
            }
        },
    )
    .await;
    assert!(std::net::TcpStream::connect(("127.0.0.1", cluster_port)).is_ok());
    // The member reports the advertised API address, not its listen address.
    let members = http.get("/v1/cluster/members").await.expect_json(200);
    assert_eq!(
        members["members"][0]["addr"], "narad-0.narad-headless.apps.svc:7942",
        "{members}"
    );
    child.kill().await.unwrap();
}

/// `narad pub` retries what the SDK retries (a refused connection, 503 and other 5xx) with
/// backoff, and honours Retry-After; it does not retry a 4xx.
#[tokio::test]
async fn pub_retries_refused_connections_and_503_with_backoff() {
    use tokio::io::AsyncReadExt;
    // Nothing listens: four attempts in all, three retries reported, then the failure.
    let closed = format!("http://127.0.0.1:{}", narad_tests::server::free_port());
    let cli = Cli::new(closed.clone());
    let out = cli.client(&["pub", "t", "m"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", out.describe());
    assert_eq!(
        out.stderr.matches("retrying in").count(),
        3,
        "{}",
        out.describe()
    );
    assert!(
        out.stderr
            .lines()
            .last()
            .unwrap()
            .starts_with("narad: cannot connect"),
        "{}",
        out.describe()
    );
    let out = cli.client(&["pub", "t", "m", "--retries", "1"]).await;
    out.failed("cannot connect");

    // A server that answers 503 (Retry-After: 0) twice, then 202; and 404 for topic `nope`.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let n = count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(k) => got.extend_from_slice(&buf[..k]),
                    }
                }
                let head = String::from_utf8_lossy(&got);
                let answer = if head.contains("/topics/nope/") {
                    "HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: 27\r\nconnection: close\r\n\r\n{\"error\":\"topic not found\"}"
                } else if n < 2 {
                    "HTTP/1.1 503 Service Unavailable\r\nretry-after: 0\r\ncontent-type: application/json\r\ncontent-length: 18\r\nconnection: close\r\n\r\n{\"error\":\"busy!!\"}"
                } else {
                    "HTTP/1.1 202 Accepted\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}"
                };
                let _ = s.write_all(answer.as_bytes()).await;
            });
        }
    });
    let cli = Cli::new(url);
    let out = cli.client(&["pub", "t", "m"]).await.ok();
    assert_eq!(
        out.stderr.matches("retrying in 0 ms").count(),
        2,
        "{}",
        out.describe()
    );
    assert_eq!(seen.load(std::sync::atomic::Ordering::SeqCst), 3);
    let before = seen.load(std::sync::atomic::Ordering::SeqCst);
    cli.client(&["pub", "nope", "m"]).await.failed("http 404");
    assert_eq!(
        seen.load(std::sync::atomic::Ordering::SeqCst),
        before + 1,
        "a 404 is not retried"
    );
}
