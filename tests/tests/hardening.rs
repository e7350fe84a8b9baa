//! What the security review of issue 12 found, each pinned by a test against a real `narad`:
//! the cluster port admits nobody without the real secret, pre-authentication bytes cost no
//! memory, and the startup checks that refuse weak or test-only settings.

use narad_tests::cluster_port::{self, Conn, AUTH_OK, ERROR};
use std::time::Duration;

use narad_tests::*;

const ROOT_PW: &str = "root-Pa55-hardening";

/// A secured single node with its cluster port on a known loopback address.
async fn secured_with_cluster_port() -> (Server, String) {
    let addr = format!("127.0.0.1:{}", server::free_port());
    let server = Server::start(
        ServerOpts::secured(ROOT_PW)
            .arg("--cluster-addr")
            .arg(addr.clone()),
    )
    .await;
    (server, addr)
}

/// The cluster address a standalone node logged ("cluster port listening"; JSON or text).
fn logged_cluster_addr(server: &Server) -> String {
    let log = std::fs::read_to_string(server.log_path()).unwrap();
    let line = log
        .lines()
        .find(|l| l.contains("cluster port listening"))
        .unwrap_or_else(|| panic!("no cluster port line in\n{log}"));
    let at = line
        .find("127.0.0.1:")
        .unwrap_or_else(|| panic!("no loopback address in {line}"));
    line[at..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ':')
        .collect()
}

async fn usernames(root: &Http) -> Vec<String> {
    let users = root.get("/v1/users").await.expect_json(200);
    let list = users
        .as_array()
        .or(users["users"].as_array())
        .unwrap_or_else(|| panic!("no user list in {users}"))
        .clone();
    list.iter()
        .map(|u| u["username"].as_str().unwrap().to_string())
        .collect()
}

/// Finding 1: a secured node without peers used to open its cluster port with the empty HMAC
/// key, so anyone who could reach it passed the handshake and could create an admin user.
#[tokio::test]
async fn a_standalone_cluster_port_admits_no_one() {
    let (server, addr) = secured_with_cluster_port().await;
    let root = Http::new(server.url()).as_user("admin", ROOT_PW);
    // The empty key and a guessed one are both refused: an Error frame, then the close.
    for secret in [&b""[..], &b"guess-guess-guess-guess-guess-guess"[..]] {
        let mut c = Conn::connect(&addr).await.unwrap();
        let verdict = c.handshake("intruder", secret).await.expect("a verdict");
        assert_eq!(verdict.kind, ERROR, "{verdict:?}");
        assert_eq!(verdict.payload, b"authentication failed");
        // A CreateUser (opcode 12) sent anyway is never answered.
        let create = br#"{"command":{"CreateUser":{"username":"mallory"}}}"#;
        assert!(c.request(1, 12, create).await.is_none());
    }
    assert_eq!(usernames(&root).await, vec!["admin".to_string()]);

    // Also with the default, OS-assigned loopback cluster port.
    let server = Server::start(logged(ServerOpts::secured(ROOT_PW))).await;
    let addr = logged_cluster_addr(&server);
    let mut c = Conn::connect(&addr).await.unwrap();
    let verdict = c.handshake("intruder", b"").await.expect("a verdict");
    assert_ne!(verdict.kind, AUTH_OK, "the empty key passed: {verdict:?}");
    // And with security off (--dev), where no one else knows the random secret either.
    let dev = Server::start(logged(ServerOpts::default())).await;
    let mut c = Conn::connect(&logged_cluster_addr(&dev)).await.unwrap();
    let verdict = c.handshake("intruder", b"").await.expect("a verdict");
    assert_ne!(verdict.kind, AUTH_OK, "the empty key passed: {verdict:?}");
}

fn logged(opts: ServerOpts) -> ServerOpts {
    opts.env("NARAD_LOG_FORMAT", "json")
        .env("NARAD_LOG_LEVEL", "info")
}

/// Finding 4: an 18-byte header announcing a 16 MiB handshake frame used to make the server
/// reserve 16 MiB before any proof (1,000 connections: 27 MB → 1.49 GB). Now a frame before
/// the proof is at most 1 KiB, buffers grow with what arrived, and handshakes are capped.
#[tokio::test]
async fn pre_authentication_bytes_cost_no_memory() {
    let (server, addr) = secured_with_cluster_port().await;
    let pid = server.pid().unwrap();
    let before = rss_bytes(pid);
    let mut conns = Vec::new();
    for _ in 0..1000 {
        let mut c = Conn::connect(&addr).await.unwrap();
        let _ = c
            .send(&cluster_port::header(
                cluster_port::AUTH_RESPONSE,
                0,
                16 << 20,
            ))
            .await;
        // Some bytes of the announced payload, as a slow sender would.
        let _ = c.send(&[0u8; 4096]).await;
        conns.push(c);
    }
    let during = rss_bytes(pid);
    // Every one of them is refused (an Error frame or a close), none is left waiting.
    for c in conns.iter_mut() {
        loop {
            match c.next().await {
                Some(f) if f.kind == ERROR || f.kind == cluster_port::AUTH_CHALLENGE => {}
                Some(f) => panic!("unexpected {f:?}"),
                None => break,
            }
        }
    }
    drop(conns);
    let after = rss_bytes(pid);
    eprintln!(
        "RSS before {} MB, with 1000 connections {} MB, after {} MB",
        before >> 20,
        during >> 20,
        after >> 20
    );
    assert!(
        during < before + (64 << 20),
        "1000 pre-auth connections took RSS from {before} to {during} bytes"
    );
    assert!(after < before + (64 << 20), "RSS {after} after they closed");
    Http::new(server.url()).get("/healthz").await.expect(200);
}

/// Finding 17: settings that cannot be honoured safely stop the node with a clear error.
#[tokio::test]
async fn weak_or_test_only_settings_stop_the_node() {
    let peers = "n0@127.0.0.1:1,n1@127.0.0.1:2,n2@127.0.0.1:3";
    let out = ServerOpts::secured(ROOT_PW)
        .arg("--node-id")
        .arg("n0")
        .arg("--peers")
        .arg(peers)
        .env("NARAD_CLUSTER_SECRET", "short-secret")
        .start_refused();
    assert!(
        out.contains("NARAD_CLUSTER_SECRET must be at least 32 bytes"),
        "{out}"
    );
    assert!(
        !out.contains("short-secret"),
        "the secret was printed: {out}"
    );

    let out = ServerOpts::default()
        .env("NARAD_TEST_HEARTBEAT_MS", "100")
        .env("NARAD_TEST_KNOBS", "false")
        .start_refused();
    assert!(
        out.contains("NARAD_TEST_HEARTBEAT_MS is a test knob")
            && out.contains("NARAD_TEST_KNOBS=true"),
        "{out}"
    );
}

/// A `NARAD_*` name in a section the server reads but not one of its settings (a typo such as
/// `NARAD_SECURITY_ENABLE`, which would otherwise leave security at its default without a
/// word) stops the node and names the setting meant. Other `NARAD_*` names (a script's own,
/// Kubernetes service links) do not.
#[tokio::test]
async fn misspelt_settings_stop_the_node_and_other_narad_names_do_not() {
    let out = ServerOpts::secured(ROOT_PW)
        .env("NARAD_SECURITY_ENABLE", "false")
        .env("NARAD_HTTP_READTIMEOUT", "5s")
        .start_refused();
    assert!(
        out.contains("NARAD_SECURITY_ENABLE (did you mean NARAD_SECURITY_ENABLED?)")
            && out.contains("NARAD_HTTP_READTIMEOUT (did you mean NARAD_HTTP_READ_TIMEOUT?)"),
        "{out}"
    );
    let out = ServerOpts::default()
        .env("NARAD_CLUSTER_TLS_CERT", "/etc/tls.crt")
        .start_refused();
    assert!(out.contains("NARAD_CLUSTER_TLS_CERT_FILE?"), "{out}");

    let server = Server::start(
        ServerOpts::default()
            .env("NARAD_BIN", "/usr/local/bin/narad")
            .env("NARAD_SERVICE_HOST", "10.96.0.10")
            .env("NARAD_PORT_7942_TCP_ADDR", "10.96.0.10")
            .env("NARAD_HTTP_SERVICE_PORT_METRICS", "9090")
            .env("NARAD_ADDR", "http://127.0.0.1:7942"),
    )
    .await;
    server.http().get("/healthz").await.expect(200);
    let log = server.log_tail(200);
    assert!(
        log.contains("no setting of the server") && log.contains("NARAD_BIN"),
        "{log}"
    );
}

/// Finding 17: usernames `.` and `..` are refused like any other invalid name.
#[tokio::test]
async fn dot_usernames_are_refused() {
    let (server, _) = secured_with_cluster_port().await;
    let root = Http::new(server.url()).as_user("admin", ROOT_PW);
    for name in [".", ".."] {
        root.post_json(
            "/v1/users",
            &serde_json::json!({"username": name, "password": "pw-1234567", "grants": []}),
        )
        .await
        .expect_error(400);
    }
    assert_eq!(usernames(&root).await, vec!["admin".to_string()]);
}

/// Finding 2: cluster TLS files that are missing or invalid used to be ignored (the node came
/// up plaintext). Now any problem stops the node and names the file.
#[tokio::test]
async fn cluster_tls_that_cannot_be_honoured_stops_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let missing = |n: &str| dir.path().join(n).display().to_string();
    let tls = |opts: ServerOpts, cert: &str, key: &str, ca: &str| {
        opts.env("NARAD_CLUSTER_TLS_CERT_FILE", cert)
            .env("NARAD_CLUSTER_TLS_KEY_FILE", key)
            .env("NARAD_CLUSTER_TLS_CA_FILE", ca)
    };
    let out = tls(
        ServerOpts::secured(ROOT_PW),
        &missing("tls.crt"),
        &missing("tls.key"),
        &missing("ca.crt"),
    )
    .start_refused();
    assert!(
        out.contains("cluster TLS certificate") && out.contains("tls.crt"),
        "{out}"
    );
    // Only some of the three.
    let out = ServerOpts::secured(ROOT_PW)
        .env("NARAD_CLUSTER_TLS_CERT_FILE", missing("tls.crt"))
        .start_refused();
    assert!(out.contains("all of NARAD_CLUSTER_TLS_CERT_FILE"), "{out}");
    // A key that does not belong to the certificate, and a CA file that is no certificate.
    let ca = narad_tests::certs::TestCa::new("ca");
    let a = ca.issue(dir.path(), "a", &["127.0.0.1"]);
    let b = ca.issue(dir.path(), "b", &["127.0.0.1"]);
    let out = tls(
        ServerOpts::secured(ROOT_PW),
        &a.cert.display().to_string(),
        &b.key.display().to_string(),
        &a.ca.display().to_string(),
    )
    .start_refused();
    assert!(out.contains("cluster TLS"), "{out}");
    std::fs::write(dir.path().join("junk.crt"), "junk").unwrap();
    let out = tls(
        ServerOpts::secured(ROOT_PW),
        &a.cert.display().to_string(),
        &a.key.display().to_string(),
        &missing("junk.crt"),
    )
    .start_refused();
    assert!(
        out.contains("cluster TLS CA") && out.contains("junk.crt"),
        "{out}"
    );
    // The same files in a config file are known keys now (they used to be refused as unknown).
    let cfg = dir.path().join("narad.json");
    std::fs::write(
        &cfg,
        serde_json::to_vec(&json!({"security": {
            "cluster_tls_cert_file": a.cert, "cluster_tls_key_file": a.key,
            "cluster_tls_ca_file": a.ca}}))
        .unwrap(),
    )
    .unwrap();
    let server = Server::start(
        logged(ServerOpts::secured(ROOT_PW))
            .arg("--config")
            .arg(cfg.display().to_string()),
    )
    .await;
    let log = std::fs::read_to_string(server.log_path()).unwrap();
    assert!(
        log.contains(r#""tls":true"#),
        "cluster port without TLS:\n{log}"
    );
}

/// `narad <args>` (a client command) with no inherited `NARAD_*`; returns (success, output).
fn cli(args: &[&str]) -> (bool, String) {
    let mut cmd = std::process::Command::new(narad_bin());
    cmd.args(args);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("NARAD_") {
            cmd.env_remove(&k);
        }
    }
    let cfg = tempfile::tempdir().unwrap();
    let out = cmd
        .env("NARAD_CONFIG_DIR", cfg.path())
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run narad");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// Finding 3: the client API over HTTPS (`http.tls_{cert,key}_file`), the CLI with a CA file,
/// and certificates reloaded when their files change.
#[tokio::test]
async fn the_api_serves_https_and_reloads_its_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let ca = narad_tests::certs::TestCa::new("api-ca");
    let files = ca.issue(dir.path(), "api", &["127.0.0.1", "localhost"]);
    let server = Server::start(ServerOpts {
        tls: Some(files.clone()),
        ..ServerOpts::default()
    })
    .await;
    let url = server.url();
    assert!(url.starts_with("https://"), "{url}");
    let http = server.http();
    http.create_topic(&json!({"name": "tls"})).await;
    http.produce_ok("tls", "", "over-tls").await;
    let m = http.consume_msg("tls", "wait=1s").await;
    assert_eq!(m.payload_bytes(), b"over-tls");
    http.ack_ok("tls", m.handle()).await;

    // Plain HTTP to the TLS port gets no answer; a client without the CA refuses the server.
    let plain = Http::new(url.replace("https://", "http://"));
    assert!(plain
        .request(Method::GET, "/healthz")
        .try_send()
        .await
        .is_err());
    assert!(Http::new(url.clone())
        .request(Method::GET, "/healthz")
        .try_send()
        .await
        .is_err());

    // The CLI: with --ca-file (or NARAD_CA_FILE) it works; without, it names the problem.
    let ca_file = files.ca.display().to_string();
    let (ok, out) = cli(&["pub", "tls", "from-cli", "-s", &url, "--ca-file", &ca_file]);
    assert!(ok, "{out}");
    let (ok, out) = cli(&["pub", "tls", "from-cli", "-s", &url]);
    assert!(!ok, "{out}");
    assert!(
        out.to_lowercase().contains("certificate") || out.contains("tls"),
        "{out}"
    );

    // Rotation to a new CA at the same paths: new connections get the new certificate.
    let new_ca = narad_tests::certs::TestCa::new("api-ca-2");
    let rotated = new_ca.issue(dir.path(), "api", &["127.0.0.1", "localhost"]);
    let new_pem = std::fs::read(&rotated.ca).unwrap();
    eventually(Duration::from_secs(10), Duration::from_millis(200), || {
        let h = Http::with_ca(url.clone(), Some(&new_pem));
        async move {
            let r = h.request(Method::GET, "/healthz").try_send().await?;
            anyhow::ensure!(r.status == 200, "{}", r.describe());
            Ok(())
        }
    })
    .await;
}

/// Finding 8: `http.read_timeout` bounds a whole request body, `http.write_timeout` a client
/// that stops reading, `http.idle_timeout` a connection that sends nothing.
#[tokio::test]
async fn slow_or_silent_clients_lose_their_connection() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = Server::start(
        ServerOpts::default()
            .env("NARAD_HTTP_READ_TIMEOUT", "2s")
            .env("NARAD_HTTP_WRITE_TIMEOUT", "2s")
            .env("NARAD_HTTP_IDLE_TIMEOUT", "2s")
            .env("NARAD_HTTP_MAX_CONSUME_WAIT", "1s")
            .env("NARAD_HTTP_SHUTDOWN_GRACE", "2s"),
    )
    .await;
    let http = server.http();
    http.create_topic(&json!({"name": "slow", "partitions": 3}))
        .await;
    let addr = format!("127.0.0.1:{}", server.port());

    // A body trickled one byte every 300 ms: 408 once the read timeout passed, then close.
    let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    s.write_all(b"POST /v1/topics/slow/produce HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    'trickle: loop {
        assert!(started.elapsed() < Duration::from_secs(10), "still open");
        if s.write_all(b"x").await.is_err() {
            break;
        }
        let read = tokio::time::timeout(Duration::from_millis(300), s.read(&mut buf)).await;
        match read {
            Ok(Ok(0)) | Ok(Err(_)) => break 'trickle,
            Ok(Ok(n)) => answer.extend_from_slice(&buf[..n]),
            Err(_) => {}
        }
    }
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains(r#"{"error":"#), "{text}");
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "{:?}",
        started.elapsed()
    );

    // A client that asks for large answers and never reads them: dropped after the write
    // timeout, having received far less than it asked for.
    let big = vec![b'a'; 1 << 20];
    for _ in 0..16 {
        http.produce_ok("slow", "partition=0", big.clone()).await;
    }
    http.wait_visible("slow", 0, 16).await;
    let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    for o in 0..16 {
        let req = format!(
            "GET /v1/topics/slow/consume?partition=0&offset={o} HTTP/1.1\r\nHost: x\r\n\r\n"
        );
        s.write_all(req.as_bytes()).await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(5)).await; // longer than the write timeout
    let mut got = 0usize;
    let drained = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got += n,
            }
        }
    })
    .await;
    assert!(drained.is_ok(), "the connection stayed open");
    assert!(
        got < 12 << 20,
        "read {got} bytes: the answers were all written"
    );

    // A connection that never sends a request is closed.
    let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let closed = tokio::time::timeout(Duration::from_secs(8), s.read(&mut buf)).await;
    assert!(
        matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
        "an idle connection stayed open: {closed:?}"
    );
    http.get("/healthz").await.expect(200);
}

/// `http.idle_timeout` is how long a kept-alive connection waits for its next request, and
/// `http.read_timeout` bounds a head from its first byte. (hyper timed the head from the end
/// of the last answer, so an idle connection was closed after the read timeout: a client that
/// reused it then could lose a produce it had sent.) A new connection's first head is timed
/// from the start.
#[tokio::test]
async fn a_kept_alive_connection_waits_the_idle_timeout_and_a_head_the_read_timeout() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const READ: Duration = Duration::from_secs(1);
    const IDLE: Duration = Duration::from_secs(5);
    let server = Server::start(
        ServerOpts::default()
            .env("NARAD_HTTP_READ_TIMEOUT", "1s")
            .env("NARAD_HTTP_IDLE_TIMEOUT", "5s"),
    )
    .await;
    let addr = format!("127.0.0.1:{}", server.port());
    let healthz = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
    let mut buf = [0u8; 4096];
    async fn answer(s: &mut tokio::net::TcpStream, buf: &mut [u8]) -> String {
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(buf))
            .await
            .expect("an answer in time")
            .expect("read");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    // Idle for twice the read timeout between two requests: the second is answered.
    let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    s.write_all(healthz).await.unwrap();
    let first = answer(&mut s, &mut buf).await;
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    tokio::time::sleep(READ * 2).await;
    s.write_all(healthz).await.unwrap();
    let second = answer(&mut s, &mut buf).await;
    assert!(
        second.starts_with("HTTP/1.1 200"),
        "a connection idle for {:?} (idle timeout {IDLE:?}) was closed: {second:?}",
        READ * 2
    );

    // A head trickled a byte every 100 ms on the same connection: closed once its first
    // byte is the read timeout old, never answered.
    let started = std::time::Instant::now();
    let head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    let mut closed = false;
    for b in head.iter() {
        if s.write_all(&[*b]).await.is_err() {
            closed = true;
            break;
        }
        match tokio::time::timeout(Duration::from_millis(100), s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {
                closed = true;
                break;
            }
            // At most a 408 before the close.
            Ok(Ok(n)) => {
                let text = String::from_utf8_lossy(&buf[..n]);
                assert!(text.starts_with("HTTP/1.1 408"), "answered: {text}");
            }
            Err(_) => {}
        }
    }
    assert!(
        closed,
        "a head trickled for {:?} was still read",
        started.elapsed()
    );
    assert!(
        started.elapsed() < READ + Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );

    // A new connection that sends nothing is closed after the read timeout, well before
    // the idle timeout.
    let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let started = std::time::Instant::now();
    let r = tokio::time::timeout(IDLE * 2, s.read(&mut buf)).await;
    assert!(matches!(r, Ok(Ok(0)) | Ok(Err(_))), "{r:?}");
    assert!(
        started.elapsed() < IDLE - Duration::from_secs(1),
        "a silent new connection was kept {:?}",
        started.elapsed()
    );
}

/// Finding 13: `HEAD …/consume` used to lease a message and drop it (the GET handler ran and
/// the body was thrown away). Now it is `405` and leases nothing.
#[tokio::test]
async fn head_never_leases() {
    let server = Server::start_default().await;
    let http = server.http();
    http.create_topic(&json!({"name": "head", "partitions": 3}))
        .await;
    http.produce_ok("head", "partition=0", "only").await;
    http.wait_visible("head", 0, 1).await;
    let r = http
        .request(Method::HEAD, "/v1/topics/head/consume?partition=0")
        .send()
        .await;
    assert_eq!(r.status, 405, "{}", r.describe());
    assert_eq!(r.header("allow"), Some("GET"));
    // The message was not leased: a consume gets it at once (it would stay invisible for the
    // 30 s visibility timeout otherwise).
    let m = http.consume_msg("head", "partition=0&wait=0").await;
    assert_eq!(m.payload_bytes(), b"only");
}

/// Finding 11: a JSON payload nested 20,000 levels used to be rendered verbatim inside the
/// consume answer, which common parsers refuse, so such a message could never be acked. Now
/// JSON deeper than 64 levels is rendered as base64 (exact bytes), and the answer parses.
#[tokio::test]
async fn deeply_nested_json_is_rendered_so_every_client_can_parse_it() {
    let server = Server::start_default().await;
    let http = server.http();
    http.create_topic(&json!({"name": "deep", "partitions": 3}))
        .await;
    let deep = format!("{}{}", "[".repeat(20_000), "]".repeat(20_000));
    let shallow = format!("{}1{}", "[".repeat(64), "]".repeat(64));
    for p in [&deep, &shallow] {
        http.produce_ok("deep", "partition=0", p.clone()).await;
    }
    http.wait_visible("deep", 0, 2).await;
    for (offset, want) in [(0, &deep), (1, &shallow)] {
        let r = http
            .consume("deep", &format!("partition=0&offset={offset}"))
            .await;
        // serde_json (128 levels) parses the whole answer.
        let v: serde_json::Value = serde_json::from_slice(&r.body)
            .unwrap_or_else(|e| panic!("offset {offset}: the answer does not parse: {e}"));
        let m = Msg::parse(&r.body).unwrap();
        assert_eq!(m.payload_bytes(), want.as_bytes(), "offset {offset}");
        let enc = v.get("payload_encoding").and_then(|e| e.as_str());
        assert_eq!(enc, if offset == 0 { Some("base64") } else { None });
    }
    // And a leased one can be acked.
    let m = http.consume_msg("deep", "partition=0").await;
    http.ack_ok("deep", m.handle()).await;
}

/// Finding 7: a wrong `current_password` on one's own password change used to cost nothing,
/// so any user could drive argon2 without limit. It now goes through the failed-login
/// throttle (5 attempts, then `429` with `Retry-After`).
#[tokio::test]
async fn wrong_current_passwords_are_throttled() {
    let (server, _) = secured_with_cluster_port().await;
    let root = server.http().as_user("admin", ROOT_PW);
    root.post_json(
        "/v1/users",
        &json!({"username": "carol", "password": "carol-pw-1", "grants": []}),
    )
    .await
    .expect(201);
    let carol = server.http().as_user("carol", "carol-pw-1");
    let change = |current: &str| json!({"current_password": current, "new_password": "carol-pw-2"});
    for _ in 0..5 {
        carol
            .request(Method::PUT, "/v1/users/carol/password")
            .json(&change("guess"))
            .send()
            .await
            .expect_error(403);
    }
    let r = carol
        .request(Method::PUT, "/v1/users/carol/password")
        .json(&change("guess"))
        .send()
        .await;
    r.expect_error(429);
    assert!(r.header("retry-after").is_some(), "{}", r.describe());
}

/// Finding 12 (permissions): the metadata store (password hashes, remote credentials) used
/// to be 0644. Everything the server creates is now private: files 0600, directories 0700,
/// and the data dir itself 0700 even when an older build made it world-readable.
#[tokio::test]
async fn data_files_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
    let server = Server::start(ServerOpts::secured(ROOT_PW).data_dir(&data)).await;
    let http = server.http().as_user("admin", ROOT_PW);
    http.create_topic(&json!({"name": "private"})).await;
    http.produce_ok("private", "partition=0", "secret-ish")
        .await;
    http.wait_visible("private", 0, 1).await;
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&data), 0o700);
    let mut seen = 0;
    let mut stack = vec![data.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let m = mode(&p);
            assert_eq!(m & 0o077, 0, "{} is {m:o}", p.display());
            seen += 1;
            if p.is_dir() {
                stack.push(p);
            }
        }
    }
    assert!(seen > 3, "only {seen} entries under the data dir");
    assert!(data.join("metastore").exists());
}

/// Finding 8 (bounded answers): a `max=100` consume of 1 MiB messages built a 140 MB answer.
/// Now one answer holds the messages that fit 16 MiB (always at least one) and leaves the rest
/// available: 40 binary messages of 1 MiB (rendered as base64, ~56 MB in all) come out in
/// several bounded batches, each message exactly once, with nothing leased that was not in an
/// answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_consume_answer_is_bounded_by_bytes() {
    const N: u64 = 40;
    let server = Server::start(ServerOpts::default()).await;
    let http = server.http();
    http.create_topic(&json!({"name": "big", "partitions": 3}))
        .await;
    for i in 0..N {
        let p = narad_tests::payload::binary(i, 1024 * 1024);
        http.produce_ok("big", &format!("partition={}", i % 3), p)
            .await;
    }
    http.wait_total_visible("big", N).await;
    let got = http
        .drain_batches("big", "wait=0", || leased(&http, "big"))
        .await;
    let mut seen: Vec<(u64, u64)> = got.iter().map(|m| (m.partition, m.offset)).collect();
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len() as u64, N, "each message exactly once");
    for m in &got {
        let i = m.offset * 3 + m.partition;
        assert!(
            m.payload_bytes() == narad_tests::payload::binary(i, 1024 * 1024),
            "message {i} changed"
        );
    }
    assert_eq!(leased(&http, "big").await, 0);
}

/// The messages of `topic` leased now on this node (`narad_inflight_size`).
async fn leased(http: &Http, topic: &str) -> u64 {
    let text = http.metrics_text().await;
    metric_sum_where(&text, "narad_inflight_size", &[("topic", topic)]).unwrap_or(0.0) as u64
}

/// `(head, body)` of one raw exchange must be the error `status` with the uniform JSON body
/// (SPEC §3.1); returns the message.
#[track_caller]
fn raw_json_error(answer: &(String, Vec<u8>), status: u16) -> String {
    let (head, body) = answer;
    let shown = format!("{head}{}", String::from_utf8_lossy(body));
    assert!(
        head.starts_with(&format!("http/1.1 {status} ")),
        "want {status}: {shown}"
    );
    assert!(
        head.contains("content-type: application/json"),
        "not JSON: {shown}"
    );
    let v: Value =
        serde_json::from_slice(body).unwrap_or_else(|e| panic!("body is not JSON ({e}): {shown}"));
    let m = v.as_object().unwrap_or_else(|| panic!("{shown}"));
    assert_eq!(m.len(), 1, "{shown}");
    let msg = m["error"].as_str().unwrap_or_else(|| panic!("{shown}"));
    assert!(!msg.is_empty(), "{shown}");
    msg.to_string()
}

/// Finding 15: what hyper answers by itself for a request head it refuses (bad
/// `Content-Length`, too many or too large headers, a target too long) used to have an empty
/// body, and `Transfer-Encoding: gzip, chunked` was read as plain chunked. Now every such
/// answer carries the JSON error body, an unknown transfer coding is `501`, and a body with a
/// `Content-Encoding` is `415`: nothing of them is stored.
#[tokio::test]
async fn parser_errors_and_unsupported_codings_answer_json() {
    use narad_tests::http::raw_exchange;
    let server = Server::start_default().await;
    let http = server.http();
    http.create_topic(&json!({"name": "codings", "partitions": 3}))
        .await;
    let addr = format!("127.0.0.1:{}", server.port());
    let exchange = |req: Vec<u8>| {
        let addr = addr.clone();
        async move {
            let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
            raw_exchange(&mut s, &req).await.unwrap()
        }
    };

    // hyper's own answers: 400, 431 (too many fields, too many bytes), 414.
    let bad_length = exchange(
        b"POST /v1/topics/codings/produce HTTP/1.1\r\nHost: x\r\nContent-Length: 12abc\r\n\r\nhello".to_vec(),
    )
    .await;
    assert!(raw_json_error(&bad_length, 400).contains("Content-Length"));
    let twice = exchange(
        b"POST /v1/topics/codings/produce HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nhi".to_vec(),
    )
    .await;
    raw_json_error(&twice, 400);
    let mut many = b"GET /healthz HTTP/1.1\r\nHost: x\r\n".to_vec();
    for i in 0..120 {
        many.extend_from_slice(format!("X-Field-{i}: v\r\n").as_bytes());
    }
    many.extend_from_slice(b"\r\n");
    assert!(raw_json_error(&exchange(many).await, 431).contains("too large"));
    let mut large = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Large: ".to_vec();
    large.extend(std::iter::repeat_n(b'a', 600 * 1024));
    large.extend_from_slice(b"\r\n\r\n");
    raw_json_error(&exchange(large).await, 431);
    let long_target = format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(70_000));
    raw_json_error(&exchange(long_target.into_bytes()).await, 414);
    // A last coding other than chunked leaves the body length unknown (RFC 9112 §6.3).
    let gzip_only = exchange(
        b"POST /v1/topics/codings/produce HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\nhello".to_vec(),
    )
    .await;
    raw_json_error(&gzip_only, 400);
    // After answered requests on the same connection, too.
    let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let ok = raw_exchange(&mut s, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    assert!(ok.0.starts_with("http/1.1 200 "), "{ok:?}");
    let after = raw_exchange(
        &mut s,
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
    )
    .await
    .unwrap();
    raw_json_error(&after, 400);

    // Codings the server does not decode: refused before anything is stored.
    let gzip_chunked = exchange(
        b"POST /v1/topics/codings/produce?partition=0 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n".to_vec(),
    )
    .await;
    assert!(raw_json_error(&gzip_chunked, 501).contains("gzip, chunked"));
    assert!(
        gzip_chunked.0.contains("connection: close"),
        "{gzip_chunked:?}"
    );
    let two_fields = exchange(
        b"POST /v1/topics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\nf\r\n{\"name\":\"te-x\"}\r\n0\r\n\r\n".to_vec(),
    )
    .await;
    raw_json_error(&two_fields, 501);
    http.get(&topic_path("te-x")).await.expect_error(404);
    // Produce decodes gzip and zstd (a body that is not gzip is `400`), nothing else.
    let compressed = exchange(
        b"POST /v1/topics/codings/produce?partition=0 HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\nContent-Length: 5\r\n\r\nhello".to_vec(),
    )
    .await;
    assert!(raw_json_error(&compressed, 400).contains("gzip"));
    let brotli = exchange(
        b"POST /v1/topics/codings/produce?partition=0 HTTP/1.1\r\nHost: x\r\nContent-Encoding: br\r\nContent-Length: 5\r\n\r\nhello".to_vec(),
    )
    .await;
    assert!(raw_json_error(&brotli, 415).contains("Content-Encoding"));
    assert!(
        brotli.0.contains("accept-encoding: gzip, zstd, identity"),
        "{brotli:?}"
    );
    let elsewhere = exchange(
        b"POST /v1/topics HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\nContent-Length: 2\r\n\r\n{}".to_vec(),
    )
    .await;
    raw_json_error(&elsewhere, 415);
    assert!(
        elsewhere.0.contains("accept-encoding: identity"),
        "{elsewhere:?}"
    );
    // Plain chunked and `identity` are read as before.
    let plain = exchange(
        b"POST /v1/topics/codings/produce?partition=0 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Encoding: identity\r\n\r\n4\r\nkept\r\n0\r\n\r\n".to_vec(),
    )
    .await;
    assert!(plain.0.starts_with("http/1.1 202 "), "{plain:?}");
    http.wait_visible("codings", 0, 1).await;
    let m = http
        .consume_msg("codings", "partition=0&offset=0&wait=0")
        .await;
    assert_eq!(m.payload_bytes(), b"kept");
    let stats = http.partition_stats("codings").await;
    let total: u64 = stats
        .iter()
        .map(|p| p["high_watermark"].as_u64().unwrap())
        .sum();
    assert_eq!(total, 1, "a refused body was stored: {stats:?}");
}

/// The metric lines of `text` that mention a label value starting with `prefix`.
fn series_mentioning(text: &str, prefix: &str) -> Vec<String> {
    let needle = format!("\"{prefix}");
    text.lines()
        .filter(|l| !l.starts_with('#') && l.contains(&needle))
        .map(str::to_string)
        .collect()
}

/// Finding 16 (series): the consume-wait series of a deleted topic (and others: rejections,
/// the oldest-message age, its child links) stayed in `/metrics` forever. Now a deleted
/// topic leaves no series that mention it, and a deleted parent takes its links' series.
#[tokio::test]
async fn deleted_topics_leave_no_series() {
    let server = Server::start_default().await;
    let http = server.http();
    http.create_topic(&json!({"name": "gone-parent", "partitions": 3}))
        .await;
    http.create_topic(&json!({"name": "gone-child", "parent": "gone-parent"}))
        .await;
    http.create_topic(&json!({"name": "gone-empty", "partitions": 3}))
        .await;
    http.create_topic(
        &json!({"name": "gone-schema", "partitions": 3, "schema": {"type": "object"}}),
    )
    .await;
    for i in 0..3 {
        http.produce_ok("gone-parent", "partition=0", format!("m{i}"))
            .await;
    }
    http.wait_visible("gone-parent", 0, 3).await;
    // Lease, extend and nack on the parent; long-poll hits on the child (fan-out copied).
    let m = http.consume_msg("gone-parent", "partition=0").await;
    http.ack("gone-parent", m.handle(), Some("true"))
        .await
        .expect(204);
    http.ack("gone-parent", m.handle(), Some("0"))
        .await
        .expect(204);
    http.consume_msg("gone-child", "wait=5s").await;
    // No-wait and timed-out consumes of an empty topic; a produce the schema refuses.
    http.consume_none("gone-empty", "wait=0").await;
    http.consume_none("gone-empty", "wait=200ms").await;
    http.produce("gone-schema", "", "42").await.expect(400);

    let before = http.metrics_text().await;
    for (family, label) in [
        ("narad_consume_wait_seconds_count", "topic=\"gone-child\""),
        ("narad_consume_wait_seconds_count", "topic=\"gone-empty\""),
        ("narad_consume_empty_total", "topic=\"gone-empty\""),
        ("narad_produce_rejections_total", "topic=\"gone-schema\""),
        ("narad_ack_extended_total", "topic=\"gone-parent\""),
        ("narad_nack_total", "topic=\"gone-parent\""),
        (
            "narad_oldest_unconsumed_message_age_seconds",
            "topic=\"gone-parent\"",
        ),
        ("narad_fanout_committed_total", "parent=\"gone-parent\""),
        ("narad_fanout_lag_messages", "parent=\"gone-parent\""),
    ] {
        assert!(
            before
                .lines()
                .any(|l| l.starts_with(family) && l.contains(label)),
            "no {family}{{{label}}} before the deletes:\n{before}"
        );
    }

    // The parent goes: its own series and its link's, while the child keeps its own.
    http.delete(&topic_path("gone-parent")).await.expect(204);
    eventually(
        Duration::from_secs(10),
        Duration::from_millis(200),
        || async {
            let left = series_mentioning(&http.metrics_text().await, "gone-parent");
            anyhow::ensure!(left.is_empty(), "still there:\n{}", left.join("\n"));
            Ok(())
        },
    )
    .await;
    for t in ["gone-child", "gone-empty", "gone-schema"] {
        http.delete(&topic_path(t)).await.expect(204);
    }
    eventually(
        Duration::from_secs(10),
        Duration::from_millis(200),
        || async {
            let left = series_mentioning(&http.metrics_text().await, "gone-");
            anyhow::ensure!(left.is_empty(), "still there:\n{}", left.join("\n"));
            Ok(())
        },
    )
    .await;
}

/// Finding 16 (exposure): `/metrics` names every topic and needs no credentials, on the API
/// port. With `http.metrics_addr` it is served on a listener of its own (plain HTTP, no
/// credentials, nothing else there) and answers `404` on the API port.
#[tokio::test]
async fn metrics_can_have_a_listener_of_their_own() {
    let port = server::free_port();
    let server = Server::start(
        ServerOpts::secured(ROOT_PW).env("NARAD_HTTP_METRICS_ADDR", format!("127.0.0.1:{port}")),
    )
    .await;
    let root = server.http().as_user("admin", ROOT_PW);
    root.create_topic(&json!({"name": "hidden-name"})).await;
    let api = server.http().anonymous();
    let r = api.get("/metrics").await;
    assert!(
        r.expect_error(404).contains("metrics listener"),
        "{}",
        r.describe()
    );
    root.get("/metrics").await.expect_error(404);
    let metrics = Http::new(format!("http://127.0.0.1:{port}")).outside_the_api();
    let text = metrics.metrics_text().await;
    assert!(text.contains("narad_build_info"), "{text}");
    assert!(text.contains("narad_topics_total 1"), "{text}");
    // Only /metrics is there: the API is not, and other methods are refused.
    metrics.get("/v1/topics").await.expect_error(404);
    metrics.get("/healthz").await.expect_error(404);
    metrics
        .request(Method::POST, "/metrics")
        .send()
        .await
        .expect_error(405);
    // The probes stay on the API port.
    api.get("/healthz").await.expect(200);
    api.get("/readyz").await.expect(200);
}

/// Finding 16 (count): nothing bounded the number of topics. `topic.max_topics` does
/// (children count too); a create beyond it is `409` until a topic is deleted.
#[tokio::test]
async fn the_topic_count_is_limited() {
    let server = Server::start(ServerOpts::default().env("NARAD_TOPIC_MAX_TOPICS", "3")).await;
    let http = server.http();
    http.create_topic(&json!({"name": "lim-a"})).await;
    http.create_topic(&json!({"name": "lim-b", "parent": "lim-a"}))
        .await;
    http.create_topic(&json!({"name": "lim-c"})).await;
    let r = http
        .post_json("/v1/topics", &json!({"name": "lim-d"}))
        .await;
    assert!(
        r.expect_error(409).contains("topic limit reached"),
        "{}",
        r.describe()
    );
    http.post_json("/v1/topics", &json!({"name": "lim-e", "parent": "lim-a"}))
        .await
        .expect_error(409);
    // An existing name is still "already exists", not the limit.
    let r = http
        .post_json("/v1/topics", &json!({"name": "lim-c"}))
        .await;
    assert!(
        r.expect_error(409).contains("already exists"),
        "{}",
        r.describe()
    );
    http.delete(&topic_path("lim-c")).await.expect(204);
    http.create_topic(&json!({"name": "lim-d"})).await;
    let list = http.get("/v1/topics").await.expect_json(200);
    assert_eq!(list["topics"].as_array().map(Vec::len), Some(3), "{list}");
}

/// Finding 9: a Raft `InstallSnapshot` chunk is written at its offset into a buffer, and a
/// chunk announcing a 256 MiB offset made a node allocate the gap (+258 MiB). Now a chunk must
/// follow what was received of that snapshot: a member (the test knows the secret) sending
/// such a chunk gets a snapshot mismatch, and the node's memory does not move.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_chunk_far_past_the_received_bytes_allocates_nothing() {
    const SECRET: &str = "a-cluster-secret-of-more-than-32-bytes";
    let addr = format!("127.0.0.1:{}", server::free_port());
    let server = Server::start(
        ServerOpts::secured(ROOT_PW)
            .env("NARAD_CLUSTER_SECRET", SECRET)
            .arg("--cluster-addr")
            .arg(addr.clone()),
    )
    .await;
    let pid = server.pid().unwrap();
    let mut c = Conn::connect(&addr).await.unwrap();
    let ok = c.handshake("n-member", SECRET.as_bytes()).await.unwrap();
    assert_eq!(ok.kind, AUTH_OK, "{ok:?}");
    let before = rss_bytes(pid);
    let leader = json!({"term": 1000, "node_id": 999});
    let chunk = |offset: u64| {
        json!({"InstallSnapshot": {
            "vote": {"leader_id": leader, "committed": true},
            "meta": {
                "last_log_id": {"leader_id": leader, "index": 5},
                "last_membership": {"log_id": null, "membership": {"configs": [], "nodes": {}}},
                "snapshot_id": "far-chunk"
            },
            "offset": offset,
            "data": [1, 2, 3, 4],
            "done": false
        }})
        .to_string()
    };
    let raft = 9; // frame type Raft; the answer is RaftReply (10)
                  // The first chunk of a snapshot starts it; the second claims to sit 256 MiB further on.
    let mut answers = Vec::new();
    for (id, offset) in [(1, 0), (2, 256u64 << 20)] {
        c.send(&cluster_port::encode(raft, id, chunk(offset).as_bytes()))
            .await
            .unwrap();
        let reply = c.next().await.expect("a Raft reply");
        assert_eq!(reply.kind, 10, "{reply:?}");
        answers.push(String::from_utf8_lossy(&reply.payload).to_string());
    }
    let after = rss_bytes(pid);
    eprintln!(
        "RSS before {} MB, after the chunk {} MB",
        before >> 20,
        after >> 20
    );
    assert!(
        after < before + (32 << 20),
        "a far snapshot chunk took RSS from {before} to {after} bytes"
    );
    assert!(!answers[0].contains("SnapshotMismatch"), "{answers:?}");
    assert!(answers[1].contains("SnapshotMismatch"), "{answers:?}");
    Http::new(server.url()).get("/healthz").await.expect(200);
}

/// A valid batch body of `n` string payloads of `each` bytes.
fn batch_body(n: usize, each: usize) -> Vec<u8> {
    let one = format!("{{\"payload\":\"{}\"}}", "b".repeat(each));
    format!("{{\"messages\":[{}]}}", vec![one; n].join(",")).into_bytes()
}

/// The node-wide budget of batch bytes in flight (`http.max_batch_bytes_in_flight`): while
/// a 10 MiB batch is still arriving, another 7 MiB one does not fit a 16 MiB budget and is
/// `429` with `Retry-After: 1` (a 503 on a produce reads as "may have been stored" to the Go
/// SDK; a 429 is a certain refusal it retries), nothing stored; the budget comes back when a request ends,
/// refused ones included.
#[tokio::test]
async fn batch_bytes_in_flight_are_bounded_node_wide() {
    use narad_tests::http::raw_exchange;
    use tokio::io::AsyncWriteExt;
    const MIB: usize = 1 << 20;
    let server = Server::start(ServerOpts::default().env(
        "NARAD_HTTP_MAX_BATCH_BYTES_IN_FLIGHT",
        (16 * MIB).to_string(),
    ))
    .await;
    let http = server.http();
    http.create_topic(&json!({"name": "budget", "partitions": 3}))
        .await;
    let addr = format!("127.0.0.1:{}", server.port());
    let head = |len: usize| {
        format!(
            "POST /v1/topics/budget/produce/batch HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len}\r\n\r\n"
        )
        .into_bytes()
    };
    let held = batch_body(10, MIB - 64);
    // A second batch: its bytes do not fit beside the first one's. If it arrives before the
    // first was admitted, it is alone and gets through (it is not valid JSON: `400`, nothing
    // stored), and the first may then be the one refused: start both again.
    let mut second = head(7 * MIB);
    second.extend(std::iter::repeat_n(b'x', 7 * MIB));
    let (mut slow, refused) =
        eventually(Duration::from_secs(30), Duration::from_millis(50), || {
            let addr = addr.clone();
            let second = second.clone();
            let first = [head(held.len()), held[..MIB].to_vec()].concat();
            async move {
                let mut slow = tokio::net::TcpStream::connect(&addr).await?;
                slow.write_all(&first).await?;
                let mut s = tokio::net::TcpStream::connect(&addr).await?;
                let (h, b) = raw_exchange(&mut s, &second).await?;
                anyhow::ensure!(h.starts_with("http/1.1 429 "), "second batch: {h}");
                Ok((slow, (h, b)))
            }
        })
        .await;
    assert!(refused.0.contains("retry-after: 1"), "{refused:?}");
    let text = String::from_utf8_lossy(&refused.1).to_string();
    assert!(text.contains("max_batch_bytes_in_flight"), "{text}");
    assert!(text.contains("nothing was stored"), "{text}");

    // The first batch completes: 202, all ten stored.
    slow.write_all(&held[MIB..]).await.unwrap();
    let (h, b) = raw_exchange(&mut slow, b"").await.unwrap();
    assert!(
        h.starts_with("http/1.1 202 "),
        "{h}{}",
        String::from_utf8_lossy(&b)
    );
    // Every request that ended (202, 429, 400) gave its bytes back: with anything left
    // over, a 10 MiB batch would not be alone and would not fit.
    for body in [batch_body(10, MIB - 64), batch_body(6, MIB - 64)] {
        http.send_raw_json(Method::POST, "/v1/topics/budget/produce/batch", body)
            .await
            .expect(202);
    }
    http.wait_total_visible("budget", 26).await;
}
