//! One `narad` server process under test.
//!
//! [`Server::start`] runs `narad server start --dev --addr 127.0.0.1:<port> --data-dir <dir>`
//! (security off; [`ServerOpts::secured`] drops `--dev` and sets `NARAD_ADMIN_PASSWORD`, so
//! security is on and root `admin` is seeded with that password), with stdout and stderr
//! appended to `narad.log` in the server's temp dir,
//! and returns once `GET /healthz` and `GET /readyz` answer `200`. The handle can kill -9,
//! SIGTERM and restart the process on the same port and data dir (optionally with changed
//! environment, [`Server::set_env`]), count its open files and threads; dropping it kills
//! the process, and if the test is panicking, prints the tail of the log first.
//!
//! The binary is `$NARAD_BIN`, else `<workspace>/target/release/narad`, else
//! `<workspace>/target/debug/narad`.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// How long a start may take before `/healthz` and `/readyz` answer `200`.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long `stop()` waits for an exit after SIGTERM: the SPEC's shutdown grace (10 s)
/// plus a margin for flushing on a loaded CI machine.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(20);
/// Lines of the server log printed when a test fails.
const LOG_TAIL_LINES: usize = 80;

/// The `narad` binary under test (see the module doc); panics with how to build it.
pub fn narad_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(p) = std::env::var_os("NARAD_BIN") {
            let p = PathBuf::from(p);
            assert!(p.is_file(), "NARAD_BIN={} does not exist", p.display());
            return p;
        }
        let ws = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("tests/ lives in the workspace")
            .to_path_buf();
        for profile in ["release", "debug"] {
            let p = ws.join("target").join(profile).join("narad");
            if p.is_file() {
                eprintln!("narad-tests: using {}", p.display());
                return p;
            }
        }
        panic!(
            "narad binary not found: set NARAD_BIN, or build it first with \
             `cargo build -p narad` (or `cargo build --release -p narad`) in {}",
            ws.display()
        )
    })
    .clone()
}

/// A loopback port free right now, for a server a test is about to start.
///
/// Chosen below the kernel's ephemeral range (`ip_local_port_range`): a port the OS hands out
/// for `bind :0` is also what it uses as the source port of outgoing connections, so one
/// freed that way can be taken by any test's client socket before the server binds it. Below
/// the range only listeners compete; each candidate is bind-tested, and a process walks the
/// range from its own starting point, so concurrent test binaries rarely try the same port.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let low: u32 = fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768);
    let (first, span) = (10_000u32, low.saturating_sub(10_000));
    if span < 1000 {
        // No room below the range: let the OS choose.
        let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        return l.local_addr().expect("local addr").port();
    }
    let _ = NEXT.compare_exchange(
        u32::MAX,
        (std::process::id().wrapping_mul(7919) ^ now_nanos()) % span,
        Ordering::AcqRel,
        Ordering::Acquire,
    );
    for _ in 0..span {
        let port = (first + NEXT.fetch_add(1, Ordering::AcqRel) % span) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {first}..{}", first + span)
}

fn now_nanos() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos())
}

/// How to start the server.
#[derive(Debug, Clone)]
pub struct ServerOpts {
    /// Pass `--dev` (security off). Default true.
    pub dev: bool,
    /// Data directory; default `<tempdir>/data`.
    pub data_dir: Option<PathBuf>,
    /// API port; default a free one.
    pub port: Option<u16>,
    /// Extra command-line arguments after the standard ones.
    pub args: Vec<String>,
    /// Extra environment (all inherited `NARAD_*` variables are removed first, except
    /// `NARAD_LOG_LEVEL`/`NARAD_LOG_FORMAT`, so the environment of the test run cannot
    /// leak into the server).
    pub env: Vec<(String, String)>,
    /// Also wait for `/readyz` (not just `/healthz`). Default true.
    pub wait_ready: bool,
    pub start_timeout: Duration,
    /// The address the API listens on and the tests reach it at; default `127.0.0.1`.
    pub host: String,
    /// Run inside this network namespace (`ip netns exec <ns> narad …`; the PID is narad's,
    /// since `ip` execs it), for tests that cut a node off the network.
    pub netns: Option<String>,
    /// Serve the API over HTTPS with these files (`--tls-cert-file`, `--tls-key-file`); the
    /// URL is then `https://…` and the probes trust the files' CA.
    pub tls: Option<crate::certs::CertFiles>,
}

impl Default for ServerOpts {
    fn default() -> Self {
        ServerOpts {
            dev: true,
            data_dir: None,
            port: None,
            args: Vec::new(),
            env: Vec::new(),
            wait_ready: true,
            start_timeout: START_TIMEOUT,
            host: "127.0.0.1".into(),
            netns: None,
            tls: None,
        }
    }
}

impl ServerOpts {
    /// Security on (no `--dev`), root `admin` seeded with `admin_password`
    /// (`NARAD_ADMIN_PASSWORD`).
    pub fn secured(admin_password: &str) -> Self {
        ServerOpts {
            dev: false,
            ..ServerOpts::default()
        }
        .env("NARAD_ADMIN_PASSWORD", admin_password)
    }

    /// Security on without `NARAD_ADMIN_PASSWORD`: the server generates the root password
    /// and logs it once.
    pub fn secured_generated() -> Self {
        ServerOpts {
            dev: false,
            ..ServerOpts::default()
        }
    }

    pub fn arg(mut self, a: impl Into<String>) -> Self {
        self.args.push(a.into());
        self
    }
    pub fn env(mut self, k: impl Into<String>, v: impl Into<String>) -> Self {
        self.env.push((k.into(), v.into()));
        self
    }
    pub fn data_dir(mut self, d: impl Into<PathBuf>) -> Self {
        self.data_dir = Some(d.into());
        self
    }

    /// Runs `narad server start` with these options and expects it to refuse to start:
    /// returns what it printed once it exited with a failure; panics if it exits 0 or is still
    /// running after [`START_TIMEOUT`] (then it is killed).
    pub fn start_refused(&self) -> String {
        let tmp = tempfile::tempdir().expect("temp dir");
        let mut cmd = Command::new(narad_bin());
        cmd.arg("server").arg("start");
        if self.dev {
            cmd.arg("--dev");
        }
        cmd.arg("--addr")
            .arg(format!("{}:{}", self.host, free_port()))
            .arg("--data-dir")
            .arg(
                self.data_dir
                    .clone()
                    .unwrap_or_else(|| tmp.path().join("data")),
            )
            .args(&self.args);
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy();
            if k.starts_with("NARAD_") {
                cmd.env_remove(&*k);
            }
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn narad");
        let deadline = Instant::now() + START_TIMEOUT;
        while child.try_wait().expect("wait").is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                let out = child.wait_with_output().expect("output");
                panic!(
                    "narad kept running instead of refusing to start: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = child.wait_with_output().expect("output");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!out.status.success(), "narad started and exited 0: {text}");
        text
    }
}

/// Why one start attempt failed.
enum StartError {
    AddrInUse,
    Failed(String),
}

pub struct Server {
    opts: ServerOpts,
    child: Option<Child>,
    port: u16,
    data_dir: PathBuf,
    log_path: PathBuf,
    starts: u32,
    /// Holds the log file and (unless given) the data dir; removed on drop.
    tmp: Option<TempDir>,
}

impl Server {
    /// Starts a server with default options (`--dev`, temp data dir, free port).
    pub async fn start_default() -> Server {
        Server::start(ServerOpts::default()).await
    }

    /// Starts a server and waits until it is healthy (and ready); panics with the log tail
    /// on failure. Retries with another port when the chosen one was taken meanwhile.
    pub async fn start(opts: ServerOpts) -> Server {
        let tmp = tempfile::Builder::new()
            .prefix("narad-test-")
            .tempdir()
            .expect("tempdir");
        let data_dir = opts
            .data_dir
            .clone()
            .unwrap_or_else(|| tmp.path().join("data"));
        fs::create_dir_all(&data_dir).expect("create data dir");
        let log_path = tmp.path().join("narad.log");
        let mut s = Server {
            port: 0,
            opts,
            child: None,
            data_dir,
            log_path,
            starts: 0,
            tmp: Some(tmp),
        };
        let fixed = s.opts.port;
        let mut attempt = 0;
        loop {
            attempt += 1;
            s.port = fixed.unwrap_or_else(free_port);
            match s.spawn_and_wait().await {
                Ok(()) => return s,
                Err(StartError::AddrInUse) if attempt < 5 => {
                    if fixed.is_some() {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
                Err(StartError::AddrInUse) => {
                    panic!(
                        "narad could not bind a port after {attempt} attempts\n{}",
                        s.log_report()
                    )
                }
                Err(StartError::Failed(why)) => panic!("{why}\n{}", s.log_report()),
            }
        }
    }

    /// Base URL, e.g. `http://127.0.0.1:41234`.
    pub fn url(&self) -> String {
        let scheme = if self.opts.tls.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}:{}", self.opts.host, self.port)
    }

    /// An [`Http`](crate::Http) client of this server (trusting its TLS CA, if any).
    pub fn http(&self) -> crate::Http {
        crate::Http::with_ca(self.url(), self.ca_pem().as_deref())
    }

    /// The PEM of the CA of the server's TLS certificate, if it serves HTTPS.
    pub fn ca_pem(&self) -> Option<Vec<u8>> {
        let t = self.opts.tls.as_ref()?;
        Some(fs::read(&t.ca).expect("read CA file"))
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// PID of the running process, if any.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Sets (or replaces) an environment variable of the next start or restart, e.g. a
    /// different `NARAD_TEST_CLOCK_OFFSET_MS` for each restart.
    pub fn set_env(&mut self, k: &str, v: impl Into<String>) {
        self.opts.env.retain(|(key, _)| key != k);
        self.opts.env.push((k.to_string(), v.into()));
    }

    /// Open file descriptors of the running process (entries of `/proc/<pid>/fd`, Linux).
    pub fn open_fds(&self) -> usize {
        self.proc_entries("fd")
    }

    /// Threads of the running process (entries of `/proc/<pid>/task`, Linux).
    pub fn threads(&self) -> usize {
        self.proc_entries("task")
    }

    fn proc_entries(&self, what: &str) -> usize {
        let pid = self.pid().expect("narad is not running");
        let dir = format!("/proc/{pid}/{what}");
        fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("read {dir}: {e}"))
            .count()
    }

    /// Whether the process is still running (reaps it if it exited).
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            None => false,
            Some(c) => matches!(c.try_wait(), Ok(None)),
        }
    }

    /// SIGKILL (kill -9) and reap. No-op if not running.
    pub fn kill9(&mut self) {
        let _ = self.signal(libc::SIGKILL);
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
    }

    /// Sends SIGTERM (graceful shutdown) without waiting.
    pub fn terminate(&mut self) {
        let _ = self.signal(libc::SIGTERM);
    }

    /// Sends `sig` to the process without waiting; an error when it is not running or
    /// kill(2) fails.
    pub fn signal(&self, sig: libc::c_int) -> std::io::Result<()> {
        let c = self
            .child
            .as_ref()
            .ok_or_else(|| std::io::Error::other("the server is not running"))?;
        // SAFETY: plain kill(2) on our own child's PID; the child is not yet reaped,
        // so the PID cannot have been recycled.
        if unsafe { libc::kill(c.id() as libc::pid_t, sig) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Waits up to `timeout` for the process to exit; returns its status (and forgets the
    /// process), or `None` if it is still running.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            let c = self.child.as_mut()?;
            if let Ok(Some(st)) = c.try_wait() {
                self.child = None;
                return Some(st);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGTERM and wait for the exit (panics with the log tail if it does not come
    /// within [`STOP_TIMEOUT`]). Returns the exit status.
    pub async fn stop(&mut self) -> ExitStatus {
        self.terminate();
        match self.wait_exit(STOP_TIMEOUT).await {
            Some(st) => st,
            None => panic!(
                "narad did not exit within {STOP_TIMEOUT:?} after SIGTERM\n{}",
                self.log_report()
            ),
        }
    }

    /// Starts the server again on the same port and data dir (kill -9 first if it is still
    /// running) and waits until it is healthy and ready.
    pub async fn restart(&mut self) {
        self.kill9();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self.spawn_and_wait().await {
                Ok(()) => return,
                Err(StartError::AddrInUse) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(StartError::AddrInUse) => panic!(
                    "restart: port {} stayed in use\n{}",
                    self.port,
                    self.log_report()
                ),
                Err(StartError::Failed(why)) => panic!("restart: {why}\n{}", self.log_report()),
            }
        }
    }

    /// The last `n` lines of the server log (all starts).
    pub fn log_tail(&self, n: usize) -> String {
        let text = fs::read(&self.log_path)
            .map(|b| strip_ansi(&String::from_utf8_lossy(&b)))
            .unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    fn log_report(&self) -> String {
        format!(
            "--- narad log tail ({}, data dir {}) ---\n{}\n--- end of narad log ---",
            self.log_path.display(),
            self.data_dir.display(),
            self.log_tail(LOG_TAIL_LINES)
        )
    }

    /// Spawns the process once on `self.port` and waits for health (and readiness).
    async fn spawn_and_wait(&mut self) -> Result<(), StartError> {
        self.starts += 1;
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .expect("open server log");
        let log_start = log.seek(SeekFrom::End(0)).unwrap_or(0);
        let _ = writeln!(
            log,
            "=== narad-tests: start #{} on {}:{} ===",
            self.starts, self.opts.host, self.port
        );

        let mut cmd = match &self.opts.netns {
            None => Command::new(narad_bin()),
            Some(ns) => {
                let mut c = Command::new("ip");
                c.arg("netns").arg("exec").arg(ns).arg(narad_bin());
                c
            }
        };
        cmd.arg("server").arg("start");
        if self.opts.dev {
            cmd.arg("--dev");
        }
        cmd.arg("--addr")
            .arg(format!("{}:{}", self.opts.host, self.port))
            .arg("--data-dir")
            .arg(&self.data_dir)
            .args(&self.opts.args);
        if let Some(t) = &self.opts.tls {
            cmd.arg("--tls-cert-file")
                .arg(&t.cert)
                .arg("--tls-key-file")
                .arg(&t.key);
        }
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy();
            if k.starts_with("NARAD_") && k != "NARAD_LOG_LEVEL" && k != "NARAD_LOG_FORMAT" {
                cmd.env_remove(&*k);
            }
        }
        cmd.envs(self.opts.env.iter().map(|(k, v)| (k, v)));
        // A test that sets a `NARAD_TEST_*` knob means it: turn on the switch the broker
        // requires for knobs, unless the test decides the switch itself.
        let knob = |k: &String| k.starts_with("NARAD_TEST_");
        if self.opts.env.iter().any(|(k, _)| knob(k))
            && !self.opts.env.iter().any(|(k, _)| k == "NARAD_TEST_KNOBS")
        {
            cmd.env("NARAD_TEST_KNOBS", "true");
        }
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup log"))
            .stderr(log);
        let child = cmd
            .spawn()
            .map_err(|e| StartError::Failed(format!("spawn {}: {e}", narad_bin().display())))?;
        self.child = Some(child);

        let probe = crate::http::client_builder(self.ca_pem().as_deref())
            .no_proxy()
            .timeout(Duration::from_secs(2))
            .build()
            .expect("probe client");
        let base = self.url();
        let deadline = Instant::now() + self.opts.start_timeout;
        loop {
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if let Some(st) = exited {
                self.child = None;
                let out = read_from(&self.log_path, log_start);
                let lower = out.to_lowercase();
                if lower.contains("address already in use") || lower.contains("addrinuse") {
                    return Err(StartError::AddrInUse);
                }
                return Err(StartError::Failed(format!(
                    "narad exited during startup ({st}) on port {}",
                    self.port
                )));
            }
            if probe_ok(&probe, &base, "/healthz").await
                && (!self.opts.wait_ready || probe_ok(&probe, &base, "/readyz").await)
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                self.kill9();
                return Err(StartError::Failed(format!(
                    "narad not healthy{} within {:?} on port {}",
                    if self.opts.wait_ready {
                        " and ready"
                    } else {
                        ""
                    },
                    self.opts.start_timeout,
                    self.port
                )));
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
}

async fn probe_ok(c: &reqwest::Client, base: &str, path: &str) -> bool {
    matches!(c.get(format!("{base}{path}")).send().await, Ok(r) if r.status().as_u16() == 200)
}

/// Removes terminal colour sequences (`ESC [ … m`) from text-format logs.
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn read_from(path: &Path, offset: u64) -> String {
    let mut s = Vec::new();
    if let Ok(mut f) = File::open(path) {
        let _ = f.seek(SeekFrom::Start(offset));
        let _ = f.read_to_end(&mut s);
    }
    String::from_utf8_lossy(&s).into_owned()
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
        if std::thread::panicking() {
            eprintln!("{}", self.log_report());
            if std::env::var_os("NARAD_TESTS_KEEP").is_some() {
                if let Some(t) = self.tmp.take() {
                    eprintln!("NARAD_TESTS_KEEP: kept {}", t.keep().display());
                }
            }
        }
    }
}
