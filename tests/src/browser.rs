//! A real headless Chromium driven over WebDriver (the W3C protocol, plain HTTP through
//! reqwest), for the console tests.
//!
//! [`Browser::start`] runs `chromedriver` on a free loopback port in a process group of its
//! own, opens a session with a headless `chromium` (a temp profile, the browser's console
//! log kept: `goog:loggingPrefs`), and offers what the tests need: go to a URL, find, click
//! and type by CSS selector, wait until an element's text satisfies a condition (polling the
//! DOM, [`crate::eventually`]), the browser's console log and screenshots. Dropping it ends
//! the session's processes (chromedriver's process group: the driver and the browser it
//! started).
//!
//! Both programs come from Debian's `chromium` and `chromium-driver` packages. Where either
//! is missing, [`available`] says why and the test skips, unless `NARAD_REQUIRE_CHROMIUM=1`
//! (CI), which makes it fail.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use base64::Engine;
use serde_json::{json, Value};
use tempfile::TempDir;

/// How long chromedriver may take to answer `/status` as ready.
const DRIVER_START: Duration = Duration::from_secs(20);
/// How long one WebDriver command may take (a navigation waits for the page's load).
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);
/// The W3C key of an element reference.
const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";

/// The first of `names` found on `PATH`.
fn on_path(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| names.iter().map(move |n| dir.join(n)))
        .find(|p| p.is_file())
}

/// The browser and its driver, or what is missing.
fn tools() -> Result<(PathBuf, PathBuf), String> {
    let browser = on_path(&["chromium", "chromium-browser"]);
    let driver = on_path(&["chromedriver"]);
    match (browser, driver) {
        (Some(b), Some(d)) => Ok((b, d)),
        (b, d) => Err(format!(
            "{} not on PATH (Debian: apt-get install chromium chromium-driver)",
            [
                b.is_none().then_some("chromium"),
                d.is_none().then_some("chromedriver"),
            ]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join(" and ")
        )),
    }
}

/// Whether a browser test can run here: `false` (and the reason printed) when chromium or
/// chromedriver is missing and `NARAD_REQUIRE_CHROMIUM=1` is not set; panics when one is
/// missing and the variable is set.
pub fn available(test: &str) -> bool {
    let Err(why) = tools() else {
        return true;
    };
    let required = std::env::var("NARAD_REQUIRE_CHROMIUM").is_ok_and(|v| v == "1");
    assert!(!required, "NARAD_REQUIRE_CHROMIUM=1 but {why}");
    eprintln!(
        "{test}: skipped: {why} (install them, or set NARAD_REQUIRE_CHROMIUM=1 to fail instead)"
    );
    false
}

/// Where screenshots go: `$CARGO_TARGET_DIR/console-screenshots/`, else the workspace's
/// `target/console-screenshots/`.
pub fn screenshot_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .parent()
                .expect("tests/ lives in the workspace")
                .join("target")
        });
    target.join("console-screenshots")
}

/// One headless Chromium session under chromedriver.
pub struct Browser {
    driver: Child,
    http: reqwest::Client,
    /// `http://127.0.0.1:<port>/session/<id>`.
    session: String,
    profile: TempDir,
}

impl Browser {
    /// Starts chromedriver and a headless Chromium session (see the module doc).
    pub async fn start() -> anyhow::Result<Browser> {
        let (chromium, chromedriver) = tools().map_err(|e| anyhow!(e))?;
        let port = crate::server::free_port();
        let profile = tempfile::tempdir()?;
        let log = std::fs::File::create(profile.path().join("chromedriver.log"))?;
        let mut cmd = Command::new(&chromedriver);
        cmd.arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        // A group of its own, so that dropping the browser ends chromium's processes too.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let driver = cmd
            .spawn()
            .with_context(|| format!("start {}", chromedriver.display()))?;
        let http = reqwest::Client::builder()
            .timeout(COMMAND_TIMEOUT)
            .build()?;
        let base = format!("http://127.0.0.1:{port}");
        let mut b = Browser {
            driver,
            http,
            session: String::new(),
            profile,
        };
        crate::try_eventually(DRIVER_START, Duration::from_millis(100), || async {
            let v: Value = b
                .http
                .get(format!("{base}/status"))
                .send()
                .await?
                .json()
                .await?;
            anyhow::ensure!(v["value"]["ready"] == true, "not ready: {v}");
            Ok(())
        })
        .await
        .context("chromedriver did not become ready")?;
        let user_data = b.profile.path().join("profile");
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--no-first-run", "--disable-extensions", "--window-size=1400,1000",
                    format!("--user-data-dir={}", user_data.display()),
                ],
            },
            "goog:loggingPrefs": {"browser": "ALL"},
        }}});
        let r: Value = b
            .http
            .post(format!("{base}/session"))
            .json(&caps)
            .send()
            .await?
            .json()
            .await?;
        let id = r["value"]["sessionId"]
            .as_str()
            .ok_or_else(|| anyhow!("no session: {r}"))?;
        b.session = format!("{base}/session/{id}");
        Ok(b)
    }

    /// One WebDriver command; its `value`, or the WebDriver error.
    async fn cmd(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<Value> {
        let mut req = self
            .http
            .request(method.clone(), format!("{}{path}", self.session));
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req
            .send()
            .await
            .with_context(|| format!("{method} {path}"))?;
        let status = resp.status();
        let v: Value = resp
            .json()
            .await
            .with_context(|| format!("{method} {path}"))?;
        if !status.is_success() {
            bail!(
                "{method} {path}: {status} {} {}",
                v["value"]["error"],
                v["value"]["message"]
            );
        }
        Ok(v["value"].clone())
    }

    async fn post(&self, path: &str, body: Value) -> anyhow::Result<Value> {
        self.cmd(reqwest::Method::POST, path, Some(body)).await
    }

    /// Navigates to `url` and waits for its load.
    pub async fn goto(&self, url: &str) -> anyhow::Result<()> {
        self.post("/url", json!({ "url": url })).await.map(|_| ())
    }

    /// The reference of the first element matching `css`.
    pub async fn find(&self, css: &str) -> anyhow::Result<String> {
        let v = self
            .post("/element", json!({"using": "css selector", "value": css}))
            .await?;
        v[ELEMENT_KEY]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| anyhow!("no element reference for {css}: {v}"))
    }

    /// How many elements match `css`.
    pub async fn count(&self, css: &str) -> anyhow::Result<usize> {
        let v = self
            .post("/elements", json!({"using": "css selector", "value": css}))
            .await?;
        Ok(v.as_array().map_or(0, Vec::len))
    }

    pub async fn click(&self, css: &str) -> anyhow::Result<()> {
        let e = self.find(css).await?;
        self.post(&format!("/element/{e}/click"), json!({}))
            .await
            .map(|_| ())
    }

    /// Clears the field `css` and types `text` into it.
    pub async fn type_into(&self, css: &str, text: &str) -> anyhow::Result<()> {
        let e = self.find(css).await?;
        self.post(&format!("/element/{e}/clear"), json!({})).await?;
        self.post(&format!("/element/{e}/value"), json!({ "text": text }))
            .await
            .map(|_| ())
    }

    /// The rendered text of the first element matching `css`.
    pub async fn text(&self, css: &str) -> anyhow::Result<String> {
        let e = self.find(css).await?;
        let v = self
            .cmd(reqwest::Method::GET, &format!("/element/{e}/text"), None)
            .await?;
        Ok(v.as_str().unwrap_or_default().to_string())
    }

    /// Runs `script` (a function body; `arguments` are `args`) in the page.
    pub async fn exec(&self, script: &str, args: Vec<Value>) -> anyhow::Result<Value> {
        self.post("/execute/sync", json!({"script": script, "args": args}))
            .await
    }

    /// Polls the DOM until the text of `css` satisfies `ok` (within `timeout`); returns it.
    pub async fn wait_text(
        &self,
        css: &str,
        timeout: Duration,
        ok: impl Fn(&str) -> bool,
    ) -> anyhow::Result<String> {
        crate::try_eventually(timeout, Duration::from_millis(100), || async {
            let t = self.text(css).await?;
            anyhow::ensure!(ok(&t), "{css} reads {t:?}");
            Ok(t)
        })
        .await
    }

    /// The entries of the browser's console log since the last call (level, message).
    pub async fn console_log(&self) -> anyhow::Result<Vec<(String, String)>> {
        let v = self.post("/se/log", json!({"type": "browser"})).await?;
        Ok(v.as_array()
            .into_iter()
            .flatten()
            .map(|e| {
                (
                    e["level"].as_str().unwrap_or_default().to_string(),
                    e["message"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect())
    }

    /// Saves a PNG of the viewport as `dir/name.png` and returns its path.
    pub async fn screenshot(&self, dir: &Path, name: &str) -> anyhow::Result<PathBuf> {
        let v = self.cmd(reqwest::Method::GET, "/screenshot", None).await?;
        let png = base64::engine::general_purpose::STANDARD
            .decode(v.as_str().ok_or_else(|| anyhow!("no screenshot data"))?)?;
        std::fs::create_dir_all(dir)?;
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, png)?;
        Ok(path)
    }

    /// Ends the session (the browser closes), then the driver.
    pub async fn quit(mut self) {
        let _ = self.cmd(reqwest::Method::DELETE, "", None).await;
        self.end_processes();
    }

    fn end_processes(&mut self) {
        if let Ok(None) = self.driver.try_wait() {
            // The driver's process group: chromedriver and the browser it started.
            // SAFETY: kill(2) with a negative pid signals a process group; no memory is shared.
            unsafe {
                libc::kill(-(self.driver.id() as i32), libc::SIGKILL);
            }
            let _ = self.driver.wait();
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        self.end_processes();
    }
}
