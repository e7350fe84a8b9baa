//! Plain HTTP: a keep-alive client over reqwest ([`Http`]) that returns whole responses
//! ([`Resp`]: status, headers, body bytes, elapsed time and a one-line description of the
//! request for failure messages). Paths are sent exactly as written, query included, so
//! tests control percent-encoding and repeated parameters. Every answer is checked against
//! the OpenAPI document ([`crate::openapi`]).

use std::time::{Duration, Instant};

use reqwest::header::HeaderMap;
use reqwest::Method;
use serde_json::Value;

/// Per-request timeout unless overridden: longer than the longest legal long poll (10 s).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How much of a body goes into failure messages.
const DESCRIBE_BODY_BYTES: usize = 400;

/// A keep-alive HTTP client bound to one server's base URL. Cheap to clone (shares the pool).
/// [`Http::as_user`] gives a handle that sends HTTP Basic credentials with every request.
#[derive(Clone)]
pub struct Http {
    client: reqwest::Client,
    base: String,
    /// The `Authorization` value sent with every request (unless a request sets its own).
    auth: Option<String>,
    /// Whether answers are checked against the OpenAPI document (the API listener's).
    checked: bool,
}

/// `Basic base64(user:password)`.
pub fn basic_auth(user: &str, password: &str) -> String {
    use base64::Engine;
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
    )
}

/// A reqwest client builder for talking to narad: rustls on ring (installed as the process's
/// provider on first use), and `ca_pem` as an extra root for `https://` servers.
pub fn client_builder(ca_pem: Option<&[u8]>) -> reqwest::ClientBuilder {
    static PROVIDER: std::sync::Once = std::sync::Once::new();
    PROVIDER.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
    let b = reqwest::Client::builder();
    match ca_pem {
        Some(pem) => b.add_root_certificate(reqwest::Certificate::from_pem(pem).expect("CA PEM")),
        None => b,
    }
}

impl Http {
    pub fn new(base: impl Into<String>) -> Self {
        Http::with_ca(base, None)
    }

    /// A client that also trusts `ca_pem` for `https://` servers.
    pub fn with_ca(base: impl Into<String>, ca_pem: Option<&[u8]>) -> Self {
        Http::from_builder(base, client_builder(ca_pem))
    }

    /// Like [`Http::with_ca`], with `host` resolved to `addr`: a name the server's
    /// certificate carries, reached at an address it does not (a Service's ClusterIP).
    pub fn with_ca_resolving(
        base: impl Into<String>,
        ca_pem: &[u8],
        host: &str,
        addr: std::net::SocketAddr,
    ) -> Self {
        Http::from_builder(base, client_builder(Some(ca_pem)).resolve(host, addr))
    }

    fn from_builder(base: impl Into<String>, builder: reqwest::ClientBuilder) -> Self {
        let client = builder
            .no_proxy()
            .http1_only()
            .tcp_nodelay(true)
            .timeout(REQUEST_TIMEOUT)
            .connect_timeout(Duration::from_secs(5))
            .pool_max_idle_per_host(64)
            .build()
            .expect("build reqwest client");
        Http {
            client,
            base: base.into().trim_end_matches('/').to_string(),
            auth: None,
            checked: true,
        }
    }

    /// The same client for a listener the OpenAPI document does not describe (the metrics
    /// listener): its answers are not checked against it.
    pub fn outside_the_api(self) -> Http {
        Http {
            checked: false,
            ..self
        }
    }

    /// The same client (same connection pool) sending `user:password` as Basic credentials.
    pub fn as_user(&self, user: &str, password: &str) -> Http {
        Http {
            auth: Some(basic_auth(user, password)),
            ..self.clone()
        }
    }

    /// The same client without credentials.
    pub fn anonymous(&self) -> Http {
        Http {
            auth: None,
            ..self.clone()
        }
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    /// A request to `path` (which may carry a query string), sent as written.
    pub fn request(&self, method: Method, path: impl Into<String>) -> Req<'_> {
        Req {
            http: self,
            method,
            path: path.into(),
            headers: Vec::new(),
            body: None,
            timeout: None,
        }
    }

    pub async fn get(&self, path: impl Into<String>) -> Resp {
        self.request(Method::GET, path).send().await
    }

    pub async fn delete(&self, path: impl Into<String>) -> Resp {
        self.request(Method::DELETE, path).send().await
    }

    /// POST with a JSON value as the body.
    pub async fn post_json(&self, path: impl Into<String>, v: &Value) -> Resp {
        self.request(Method::POST, path).json(v).send().await
    }

    /// PATCH with a JSON value as the body.
    pub async fn patch_json(&self, path: impl Into<String>, v: &Value) -> Resp {
        self.request(Method::PATCH, path).json(v).send().await
    }

    /// A request with arbitrary bytes labelled `application/json` (malformed JSON tests).
    pub async fn send_raw_json(
        &self,
        method: Method,
        path: impl Into<String>,
        body: impl Into<Vec<u8>>,
    ) -> Resp {
        self.request(method, path)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
    }
}

/// A request being built; see [`Http::request`].
pub struct Req<'a> {
    http: &'a Http,
    method: Method,
    path: String,
    headers: Vec<(String, String)>,
    body: Option<Vec<u8>>,
    timeout: Option<Duration>,
}

impl Req<'_> {
    pub fn header(mut self, k: &str, v: &str) -> Self {
        self.headers.push((k.to_string(), v.to_string()));
        self
    }
    pub fn body(mut self, b: impl Into<Vec<u8>>) -> Self {
        self.body = Some(b.into());
        self
    }
    pub fn json(self, v: &Value) -> Self {
        self.header("content-type", "application/json")
            .body(serde_json::to_vec(v).expect("json"))
    }
    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = Some(t);
        self
    }

    /// Sends; a transport failure (refused, reset, timeout) is an error.
    pub async fn try_send(self) -> Result<Resp, reqwest::Error> {
        let url = format!("{}{}", self.http.base, self.path);
        let describe = describe_request(&self.method, &self.path, self.body.as_deref());
        let (method, path) = (self.method.clone(), self.path.clone());
        let mut rb = self.http.client.request(self.method, &url);
        if let Some(auth) = &self.http.auth {
            if !self
                .headers
                .iter()
                .any(|(k, _)| k.eq_ignore_ascii_case("authorization"))
            {
                rb = rb.header("authorization", auth.as_str());
            }
        }
        for (k, v) in &self.headers {
            rb = rb.header(k.as_str(), v.as_str());
        }
        if let Some(b) = self.body {
            rb = rb.body(b);
        }
        if let Some(t) = self.timeout {
            rb = rb.timeout(t);
        }
        let start = Instant::now();
        let r = rb.send().await?;
        let status = r.status().as_u16();
        let headers = r.headers().clone();
        let body = r.bytes().await?.to_vec();
        let resp = Resp {
            status,
            headers,
            body,
            elapsed: start.elapsed(),
            request: describe,
        };
        if self.http.checked {
            crate::openapi::check(&method, &path, &resp);
        }
        Ok(resp)
    }

    /// Sends; panics on a transport failure (the server is expected to be up).
    pub async fn send(self) -> Resp {
        let describe = describe_request(&self.method, &self.path, self.body.as_deref());
        match self.try_send().await {
            Ok(r) => r,
            Err(e) => panic!("{describe}: transport error: {e:?}"),
        }
    }
}

fn describe_request(method: &Method, path: &str, body: Option<&[u8]>) -> String {
    match body {
        Some(b) if !b.is_empty() => format!("{method} {path} body={}", snippet(b)),
        _ => format!("{method} {path}"),
    }
}

fn snippet(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(&b[..b.len().min(DESCRIBE_BODY_BYTES)]).into_owned();
    if b.len() > DESCRIBE_BODY_BYTES {
        format!("{s:?}…({} bytes)", b.len())
    } else {
        format!("{s:?}")
    }
}

/// A complete HTTP response.
#[derive(Debug, Clone)]
pub struct Resp {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
    /// Time from sending the request to the end of the body.
    pub elapsed: Duration,
    /// One line describing the request (method, path, body snippet).
    pub request: String,
}

impl Resp {
    /// `"<request> -> <status> <body snippet>"`, for failure messages.
    pub fn describe(&self) -> String {
        format!(
            "{} -> {} {}",
            self.request,
            self.status,
            snippet(&self.body)
        )
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON (panics with the description if it is not).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{}: body is not JSON: {e}", self.describe()))
    }

    /// Panics unless the status is `want`.
    #[track_caller]
    pub fn expect(&self, want: u16) -> &Self {
        assert_eq!(self.status, want, "{}", self.describe());
        self
    }

    /// Panics unless the status is `want` and the body is JSON (`application/json`).
    #[track_caller]
    pub fn expect_json(&self, want: u16) -> Value {
        self.expect(want);
        let ct = self.header("content-type").unwrap_or("");
        assert!(
            ct.starts_with("application/json"),
            "{}: Content-Type {ct:?}, want application/json",
            self.describe()
        );
        self.json()
    }

    /// Panics unless this is the error `want` with the uniform body (SPEC §3.1); returns
    /// the error message.
    #[track_caller]
    pub fn expect_error(&self, want: u16) -> String {
        if let Some(p) = self.error_problem(want) {
            panic!("{p}");
        }
        self.error_message().unwrap_or_default()
    }

    /// `None` if this is status `want` with `Content-Type: application/json` and a body of
    /// exactly `{"error":"<non-empty message>"}`; else what is wrong.
    pub fn error_problem(&self, want: u16) -> Option<String> {
        if self.status != want {
            return Some(format!("want {want}, got {}", self.describe()));
        }
        let ct = self.header("content-type").unwrap_or("");
        if !ct.starts_with("application/json") {
            return Some(format!(
                "error Content-Type is {ct:?}, want application/json: {}",
                self.describe()
            ));
        }
        match serde_json::from_slice::<Value>(&self.body) {
            Ok(Value::Object(m))
                if m.len() == 1
                    && m.get("error")
                        .and_then(Value::as_str)
                        .is_some_and(|s| !s.is_empty()) =>
            {
                None
            }
            _ => Some(format!(
                "error body is not {{\"error\":\"…\"}}: {}",
                self.describe()
            )),
        }
    }

    /// The `error` string of a JSON error body, if any.
    pub fn error_message(&self) -> Option<String> {
        serde_json::from_slice::<Value>(&self.body)
            .ok()?
            .get("error")?
            .as_str()
            .map(str::to_string)
    }
}

/// One HTTP/1.1 exchange on a raw, caller-owned connection (for keep-alive checks that a
/// pooled client would hide): writes `request`, then reads one response head and its
/// `Content-Length` body — even if the write failed part-way (a server may answer early and
/// close); the write error is returned only when no response can be read. Returns the head
/// (status line + headers, lower-cased) and the body.
pub async fn raw_exchange(
    stream: &mut tokio::net::TcpStream,
    request: &[u8],
) -> std::io::Result<(String, Vec<u8>)> {
    use tokio::io::AsyncWriteExt;
    let write_err = stream.write_all(request).await.err();
    let read = read_response(stream).await;
    match (read, write_err) {
        (Err(_), Some(w)) => Err(w),
        (r, _) => r,
    }
}

async fn read_response(stream: &mut tokio::net::TcpStream) -> std::io::Result<(String, Vec<u8>)> {
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "connection closed before a response",
            ));
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let mut body = buf[head_end..].to_vec();
    while body.len() < len {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    body.truncate(len);
    Ok((head, body))
}
