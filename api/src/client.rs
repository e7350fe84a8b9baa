//! An async client of the `/v1` HTTP API (SPEC §3) over reqwest: HTTP/1.1 keep-alive, HTTP
//! Basic auth, plain `http` (TLS terminates in front of Narad).
//!
//! Every method makes exactly one HTTP request (no retries: callers decide, see
//! [`Error::is_retryable`]). An unexpected status becomes [`Error::Api`] whose `Display` is
//! `http <code>: <server message>`.

use std::time::Duration;

use bytes::Bytes;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use reqwest::header::{HeaderMap, HeaderValue, ACCEPT, CONTENT_TYPE, RETRY_AFTER};
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::admin::*;
use crate::duration::format_go_duration;
use crate::error::{Error, HttpError};
use crate::render::encode_batch_payload;
use crate::types::*;

/// Characters left as they are in a path segment or query value (Go's unreserved set).
const ENCODE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Percent-encodes a UTF-8 path segment or query value.
pub fn escape(s: &str) -> String {
    utf8_percent_encode(s, ENCODE).to_string()
}

/// Percent-encodes arbitrary bytes (keys) for a query value.
pub fn escape_bytes(b: &[u8]) -> String {
    percent_encoding::percent_encode(b, ENCODE).to_string()
}

/// Extra time given to a long-poll consume beyond its `wait`.
pub const LONG_POLL_MARGIN: Duration = Duration::from_secs(10);
/// Default per-request timeout of data-plane and read calls.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Per-request timeout of control-plane writes (a forwarded create may take up to 75 s).
pub const CONTROL_TIMEOUT: Duration = Duration::from_secs(90);

/// The value sent in `X-Narad-Client` and `User-Agent`.
pub const USER_AGENT: &str = concat!("narad-rs/", env!("CARGO_PKG_VERSION"));

/// Outcome of a replay read (`consume?partition=P&offset=O`).
#[derive(Debug, Clone)]
pub enum Replay {
    /// `200`: the message at that offset.
    Message(Message),
    /// `204`: at or past the high watermark.
    End,
    /// `410`: below the oldest retained offset, or permanently unreadable.
    Gone,
}

/// How to settle a lease: `POST …/ack` with `extend` absent, `true` or `0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    Ack,
    Extend,
    Nack,
}

impl Settle {
    fn query(self) -> Option<&'static str> {
        match self {
            Settle::Ack => None,
            Settle::Extend => Some("true"),
            Settle::Nack => Some("0"),
        }
    }
}

/// Builds a batch-produce element that the server stores byte-exact (raw JSON when the bytes
/// are compact JSON, else base64); keys as text when UTF-8, else base64.
pub fn batch_message(payload: &[u8], key: Option<&[u8]>, partition: Option<u32>) -> BatchMessage {
    let (payload, enc) = encode_batch_payload(payload);
    let (key, key_encoding) = match key.filter(|k| !k.is_empty()) {
        None => (None, None),
        Some(k) => {
            let (k, e) = crate::render::render_key(k);
            (Some(k.into_owned()), e.map(str::to_string))
        }
    };
    BatchMessage {
        payload,
        payload_encoding: enc.map(str::to_string),
        key,
        key_encoding,
        partition: partition.map(i64::from),
        attributes: None,
        delay: None,
        idempotency_key: None,
    }
}

/// An async `/v1` client. Cheap to clone (shares the connection pool).
#[derive(Clone, Debug)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    auth: Option<(String, String)>,
    timeout: Duration,
}

/// Normalises a base URL: a missing scheme becomes `http://`, trailing `/` are trimmed, only
/// `http` and `https` are accepted.
pub fn normalize_base_url(url: &str) -> Result<String, Error> {
    let url = url.trim();
    if url.is_empty() {
        return Err(Error::Invalid("empty server address".into()));
    }
    let with_scheme = if url.contains("://") {
        url.to_string()
    } else {
        format!("http://{url}")
    };
    let parsed = reqwest::Url::parse(&with_scheme)
        .map_err(|e| Error::Invalid(format!("invalid server address {url:?}: {e}")))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(Error::Invalid(format!(
            "invalid server address {url:?}: scheme must be http or https"
        )));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(Error::Invalid(format!(
            "invalid server address {url:?}: no host"
        )));
    }
    if parsed.query().is_some() || parsed.fragment().is_some() {
        return Err(Error::Invalid(format!(
            "invalid server address {url:?}: no query or fragment allowed"
        )));
    }
    Ok(with_scheme.trim_end_matches('/').to_string())
}

/// The TLS client configuration of `https://` servers: rustls on ring, the system's roots
/// plus `ca_pem` (at least one usable root, or an error naming what is wrong).
/// Adds the certificates of a PEM bundle to `roots` as trust anchors: at least one, each
/// valid PEM and a usable X.509 CA certificate (the error says which is wrong). Every place
/// that takes a CA bundle (the CLI, remote-child links, the cluster port) reads it this way.
pub fn add_ca_pem(roots: &mut rustls::RootCertStore, pem: &[u8]) -> Result<usize, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("not PEM certificates: {e}"))?;
    if certs.is_empty() {
        return Err("holds no certificate".into());
    }
    let n = certs.len();
    for c in certs {
        roots
            .add(c)
            .map_err(|e| format!("holds an unusable certificate: {e}"))?;
    }
    Ok(n)
}

pub fn tls_config(ca_pem: Option<&[u8]>) -> Result<rustls::ClientConfig, Error> {
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(c);
    }
    if let Some(pem) = ca_pem {
        add_ca_pem(&mut roots, pem).map_err(|e| Error::Invalid(format!("CA file: {e}")))?;
    }
    let mut cfg = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| Error::Invalid(format!("TLS: {e}")))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}

/// A query string under construction (`?a=1&b=2`), values percent-encoded.
#[derive(Default)]
struct Query(String);

impl Query {
    fn push_raw(&mut self, k: &str, encoded: &str) {
        self.0.push(if self.0.is_empty() { '?' } else { '&' });
        self.0.push_str(k);
        self.0.push('=');
        self.0.push_str(encoded);
    }
    fn push(&mut self, k: &str, v: impl std::fmt::Display) -> &mut Self {
        let v = v.to_string();
        self.push_raw(k, &escape(&v));
        self
    }
    fn opt(&mut self, k: &str, v: Option<impl std::fmt::Display>) -> &mut Self {
        if let Some(v) = v {
            self.push(k, v);
        }
        self
    }
    fn bytes(&mut self, k: &str, v: &[u8]) -> &mut Self {
        self.push_raw(k, &escape_bytes(v));
        self
    }
}

impl Client {
    /// A client of the server at `base_url` (e.g. `http://127.0.0.1:7942`, or `host:port`),
    /// with optional Basic credentials (sent when the username is non-empty). `https://`
    /// servers are verified against the system's roots.
    pub fn new(base_url: &str, auth: Option<(String, String)>) -> Result<Client, Error> {
        Client::with_ca(base_url, auth, None)
    }

    /// As [`Client::new`], with `https://` servers verified against the system's roots plus
    /// the certificates of `ca_pem` (PEM; e.g. the CA of a cluster's own certificates).
    pub fn with_ca(
        base_url: &str,
        auth: Option<(String, String)>,
        ca_pem: Option<&[u8]>,
    ) -> Result<Client, Error> {
        let base = normalize_base_url(base_url)?;
        let mut headers = HeaderMap::new();
        headers.insert(ACCEPT, HeaderValue::from_static("application/json"));
        headers.insert("x-narad-client", HeaderValue::from_static(USER_AGENT));
        let http = reqwest::Client::builder()
            .user_agent(USER_AGENT)
            .default_headers(headers)
            .http1_only()
            .no_proxy()
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_max_idle_per_host(64)
            .connect_timeout(Duration::from_secs(10))
            .tcp_nodelay(true)
            .tls_backend_preconfigured(tls_config(ca_pem)?)
            .build()
            .map_err(|e| Error::Invalid(format!("cannot build HTTP client: {e}")))?;
        Ok(Client {
            http,
            base,
            auth: auth.filter(|(u, _)| !u.is_empty()),
            timeout: DEFAULT_TIMEOUT,
        })
    }

    /// Sets the per-request timeout of ordinary calls (default 30 s). Long-poll consumes get
    /// `wait + 10 s`; control-plane writes at least 90 s.
    pub fn with_timeout(mut self, timeout: Duration) -> Client {
        self.timeout = timeout;
        self
    }

    /// The normalised base URL.
    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// The username in use, if any.
    pub fn username(&self) -> Option<&str> {
        self.auth.as_ref().map(|(u, _)| u.as_str())
    }

    fn topic_path(topic: &str) -> String {
        format!("/v1/topics/{}", escape(topic))
    }

    fn control_timeout(&self) -> Duration {
        self.timeout.max(CONTROL_TIMEOUT)
    }

    /// Sends one request; returns the status and body when the status is one of `ok`.
    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<(Bytes, &'static str)>,
        timeout: Duration,
        ok: &[u16],
    ) -> Result<(StatusCode, Bytes), Error> {
        let url = format!("{}{}", self.base, path);
        let mut req = self.http.request(method, &url).timeout(timeout);
        if let Some((u, p)) = &self.auth {
            req = req.basic_auth(u, Some(p));
        }
        if let Some((b, ct)) = body {
            req = req.header(CONTENT_TYPE, ct).body(b);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| Error::from_reqwest(e, &self.base))?;
        let status = resp.status();
        let retry_after = resp
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| Error::from_reqwest(e, &self.base))?;
        if ok.contains(&status.as_u16()) {
            Ok((status, bytes))
        } else {
            Err(Error::Api(HttpError::from_body(
                status.as_u16(),
                &bytes,
                retry_after.as_deref(),
            )))
        }
    }

    async fn send_json<B: Serialize + ?Sized>(
        &self,
        method: Method,
        path: &str,
        body: &B,
        timeout: Duration,
        ok: &[u16],
    ) -> Result<(StatusCode, Bytes), Error> {
        let b = serde_json::to_vec(body)
            .map_err(|e| Error::Invalid(format!("cannot encode request: {e}")))?;
        self.send(
            method,
            path,
            Some((Bytes::from(b), "application/json")),
            timeout,
            ok,
        )
        .await
    }

    fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Error> {
        serde_json::from_slice(bytes).map_err(|e| Error::Decode(e.to_string()))
    }

    async fn get_json<T: DeserializeOwned>(&self, path: &str) -> Result<T, Error> {
        let (_, b) = self
            .send(Method::GET, path, None, self.timeout, &[200])
            .await?;
        Self::decode(&b)
    }

    // ---- topics (§3.3) ----

    /// `POST /v1/topics` → `201` record.
    pub async fn create_topic(&self, req: &CreateTopicRequest) -> Result<TopicRecord, Error> {
        let (_, b) = self
            .send_json(
                Method::POST,
                "/v1/topics",
                req,
                self.control_timeout(),
                &[201],
            )
            .await?;
        Self::decode(&b)
    }

    /// `GET /v1/topics?limit=N&page_token=T`: one page.
    pub async fn list_topics_page(
        &self,
        limit: Option<u32>,
        page_token: Option<&str>,
    ) -> Result<TopicList, Error> {
        let mut q = Query::default();
        q.opt("limit", limit);
        if let Some(t) = page_token.filter(|t| !t.is_empty()) {
            q.push("page_token", t);
        }
        self.get_json(&format!("/v1/topics{}", q.0)).await
    }

    /// All topics, following `next_page_token` until it is empty.
    pub async fn list_topics(&self) -> Result<Vec<TopicRecord>, Error> {
        let mut all = Vec::new();
        let mut token = String::new();
        loop {
            let page = self.list_topics_page(Some(1000), Some(&token)).await?;
            all.extend(page.topics);
            if page.next_page_token.is_empty() || page.next_page_token == token {
                return Ok(all);
            }
            token = page.next_page_token;
        }
    }

    /// `GET /v1/topics/{topic}[?partition=N]`: record plus `partition_stats`.
    pub async fn get_topic(
        &self,
        topic: &str,
        partition: Option<u32>,
    ) -> Result<TopicRecord, Error> {
        let mut q = Query::default();
        q.opt("partition", partition);
        self.get_json(&format!("{}{}", Self::topic_path(topic), q.0))
            .await
    }

    /// `PATCH /v1/topics/{topic}` → `200` record.
    pub async fn alter_topic(
        &self,
        topic: &str,
        req: &AlterTopicRequest,
    ) -> Result<TopicRecord, Error> {
        let (_, b) = self
            .send_json(
                Method::PATCH,
                &Self::topic_path(topic),
                req,
                self.control_timeout(),
                &[200],
            )
            .await?;
        Self::decode(&b)
    }

    /// `DELETE /v1/topics/{topic}` → `204`.
    pub async fn delete_topic(&self, topic: &str) -> Result<(), Error> {
        self.send(
            Method::DELETE,
            &Self::topic_path(topic),
            None,
            self.control_timeout(),
            &[204],
        )
        .await?;
        Ok(())
    }

    // ---- queue administration (ext) ----

    /// A bodiless `POST /v1/topics/{topic}/{action}` → `200` JSON answer.
    async fn post_topic_action<T: DeserializeOwned>(
        &self,
        topic: &str,
        action: &str,
    ) -> Result<T, Error> {
        self.post_topic_action_within(topic, action, self.control_timeout())
            .await
    }

    /// [`Client::post_topic_action`] with its own timeout (`action` may carry a query).
    async fn post_topic_action_within<T: DeserializeOwned>(
        &self,
        topic: &str,
        action: &str,
        timeout: Duration,
    ) -> Result<T, Error> {
        let path = format!("{}/{action}", Self::topic_path(topic));
        let (_, b) = self
            .send(
                Method::POST,
                &path,
                Some((Bytes::new(), "application/json")),
                timeout,
                &[200],
            )
            .await?;
        Self::decode(&b)
    }

    /// `POST /v1/topics/{topic}/pause` → `200` record (`paused`): consumes answer `204`
    /// until resumed; produce, replay and children go on.
    pub async fn pause_topic(&self, topic: &str) -> Result<TopicRecord, Error> {
        self.post_topic_action(topic, "pause").await
    }

    /// `POST /v1/topics/{topic}/resume` → `200` record.
    pub async fn resume_topic(&self, topic: &str) -> Result<TopicRecord, Error> {
        self.post_topic_action(topic, "resume").await
    }

    /// `POST /v1/topics/{topic}/purge` → `200`: every partition's frontier jumps to its
    /// high watermark (everything committed so far counts as settled).
    pub async fn purge_topic(&self, topic: &str) -> Result<Repositioned, Error> {
        self.post_topic_action(topic, "purge").await
    }

    /// `POST /v1/topics/{topic}/redrive?to=T&max=N` → `200`: moves up to `max` messages of a
    /// dead-letter topic to `to`, or each back to the topic it was dead-lettered from.
    pub async fn redrive_topic(
        &self,
        topic: &str,
        to: Option<&str>,
        max: Option<u64>,
    ) -> Result<Redriven, Error> {
        let mut query = Vec::new();
        if let Some(t) = to {
            query.push(format!("to={}", escape(t)));
        }
        if let Some(m) = max {
            query.push(format!("max={m}"));
        }
        let action = if query.is_empty() {
            "redrive".to_string()
        } else {
            format!("redrive?{}", query.join("&"))
        };
        // A long move (up to 100,000 messages) takes its time.
        let timeout = self.control_timeout().max(Duration::from_secs(600));
        self.post_topic_action_within(topic, &action, timeout).await
    }

    /// `POST /v1/topics/{topic}/seek` → `200`: moves the frontier of one partition to an
    /// offset, or of one or every partition to a time.
    pub async fn seek_topic(&self, topic: &str, req: &SeekRequest) -> Result<Repositioned, Error> {
        let path = format!("{}/seek", Self::topic_path(topic));
        let (_, b) = self
            .send_json(Method::POST, &path, req, self.control_timeout(), &[200])
            .await?;
        Self::decode(&b)
    }

    // ---- produce (§3.4) ----

    /// `POST /v1/topics/{topic}/produce?key=K&partition=P` with the raw bytes → `202`.
    /// An empty key is not sent (it means "no key").
    pub async fn produce(
        &self,
        topic: &str,
        payload: impl Into<Bytes>,
        key: Option<&[u8]>,
        partition: Option<u32>,
    ) -> Result<(), Error> {
        let payload = payload.into();
        if payload.is_empty() {
            return Err(Error::Invalid("empty message".into()));
        }
        let mut q = Query::default();
        if let Some(k) = key.filter(|k| !k.is_empty()) {
            q.bytes("key", k);
        }
        q.opt("partition", partition);
        let path = format!("{}/produce{}", Self::topic_path(topic), q.0);
        self.send(
            Method::POST,
            &path,
            Some((payload, "application/octet-stream")),
            self.timeout,
            &[202],
        )
        .await?;
        Ok(())
    }

    /// `POST /v1/topics/{topic}/produce/batch` (1–100 messages) → the `accepted` count.
    /// Build elements with [`batch_message`].
    pub async fn produce_batch(
        &self,
        topic: &str,
        messages: &[BatchMessage],
    ) -> Result<usize, Error> {
        #[derive(Serialize)]
        struct Body<'a> {
            messages: &'a [BatchMessage],
        }
        if messages.is_empty() {
            return Err(Error::Invalid("empty batch".into()));
        }
        let path = format!("{}/produce/batch", Self::topic_path(topic));
        let (_, b) = self
            .send_json(
                Method::POST,
                &path,
                &Body { messages },
                self.timeout,
                &[202],
            )
            .await?;
        let r: BatchProduceResponse = Self::decode(&b)?;
        Ok(r.accepted)
    }

    // ---- consume and replay (§3.5) ----

    fn consume_path(
        topic: &str,
        wait: Option<Duration>,
        partition: Option<u32>,
        max: Option<u32>,
    ) -> String {
        let mut q = Query::default();
        q.opt("max", max);
        q.opt("partition", partition);
        if let Some(w) = wait.filter(|w| !w.is_zero()) {
            q.push("wait", format_go_duration(w));
        }
        format!("{}/consume{}", Self::topic_path(topic), q.0)
    }

    /// A long poll's timeout: its `wait` plus [`LONG_POLL_MARGIN`].
    fn poll_timeout(&self, wait: Option<Duration>) -> Duration {
        wait.unwrap_or_default() + LONG_POLL_MARGIN
    }

    /// Queue consume of one message (takes a lease): `Some` on `200`, `None` on `204`.
    /// `wait` is the long poll (the server clamps it, 10 s by default).
    pub async fn consume(
        &self,
        topic: &str,
        wait: Option<Duration>,
        partition: Option<u32>,
    ) -> Result<Option<Message>, Error> {
        let path = Self::consume_path(topic, wait, partition, None);
        let (status, b) = self
            .send(
                Method::GET,
                &path,
                None,
                self.poll_timeout(wait),
                &[200, 204],
            )
            .await?;
        if status == StatusCode::NO_CONTENT {
            return Ok(None);
        }
        Self::decode(&b).map(Some)
    }

    /// Queue consume of up to `max` (1–100) messages; empty on `204`. Also reads the
    /// single-message shape an older server answers.
    pub async fn consume_batch(
        &self,
        topic: &str,
        wait: Option<Duration>,
        partition: Option<u32>,
        max: u32,
    ) -> Result<Vec<Message>, Error> {
        let path = Self::consume_path(topic, wait, partition, Some(max));
        let (status, b) = self
            .send(
                Method::GET,
                &path,
                None,
                self.poll_timeout(wait),
                &[200, 204],
            )
            .await?;
        if status == StatusCode::NO_CONTENT {
            return Ok(Vec::new());
        }
        match serde_json::from_slice::<MessageBatch>(&b) {
            Ok(batch) => Ok(batch.messages),
            Err(e) => match serde_json::from_slice::<Message>(&b) {
                Ok(m) => Ok(vec![m]),
                Err(_) => Err(Error::Decode(e.to_string())),
            },
        }
    }

    /// Replay read of `partition` at `offset` (no lease).
    pub async fn replay(&self, topic: &str, partition: u32, offset: u64) -> Result<Replay, Error> {
        let mut q = Query::default();
        q.push("offset", offset).push("partition", partition);
        let path = format!("{}/consume{}", Self::topic_path(topic), q.0);
        match self
            .send(Method::GET, &path, None, self.timeout, &[200, 204])
            .await
        {
            Ok((StatusCode::NO_CONTENT, _)) => Ok(Replay::End),
            Ok((_, b)) => Self::decode(&b).map(Replay::Message),
            Err(Error::Api(e)) if e.status == 410 => Ok(Replay::Gone),
            Err(e) => Err(e),
        }
    }

    // ---- ack, extend, nack (§3.6) ----

    /// Settles one lease (`204`). A lapsed or stale handle is `Error::Api` with status `410`.
    pub async fn settle(
        &self,
        topic: &str,
        receipt_handle: &str,
        how: Settle,
    ) -> Result<(), Error> {
        let mut q = Query::default();
        q.opt("extend", how.query())
            .push("receipt_handle", receipt_handle);
        let path = format!("{}/ack{}", Self::topic_path(topic), q.0);
        self.send(
            Method::POST,
            &path,
            Some((Bytes::new(), "application/json")),
            self.timeout,
            &[204],
        )
        .await?;
        Ok(())
    }

    /// Acks one message.
    pub async fn ack(&self, topic: &str, receipt_handle: &str) -> Result<(), Error> {
        self.settle(topic, receipt_handle, Settle::Ack).await
    }

    /// Restarts the lease with a full visibility timeout.
    pub async fn extend(&self, topic: &str, receipt_handle: &str) -> Result<(), Error> {
        self.settle(topic, receipt_handle, Settle::Extend).await
    }

    /// Hands the message back at once.
    pub async fn nack(&self, topic: &str, receipt_handle: &str) -> Result<(), Error> {
        self.settle(topic, receipt_handle, Settle::Nack).await
    }

    /// Batch settle (1–100 handles): one result per handle, in order.
    pub async fn settle_batch(
        &self,
        topic: &str,
        receipt_handles: &[String],
        how: Settle,
    ) -> Result<Vec<AckResult>, Error> {
        #[derive(Serialize)]
        struct Body<'a> {
            receipt_handles: &'a [String],
        }
        let mut q = Query::default();
        q.opt("extend", how.query());
        let path = format!("{}/ack{}", Self::topic_path(topic), q.0);
        let (_, b) = self
            .send_json(
                Method::POST,
                &path,
                &Body { receipt_handles },
                self.timeout,
                &[200],
            )
            .await?;
        let r: BatchAckResponse = Self::decode(&b)?;
        if r.results.len() != receipt_handles.len() {
            return Err(Error::Decode(format!(
                "{} results for {} receipt handles",
                r.results.len(),
                receipt_handles.len()
            )));
        }
        Ok(r.results)
    }

    /// Batch ack.
    pub async fn ack_batch(
        &self,
        topic: &str,
        receipt_handles: &[String],
    ) -> Result<Vec<AckResult>, Error> {
        self.settle_batch(topic, receipt_handles, Settle::Ack).await
    }

    /// Batch extend.
    pub async fn extend_batch(
        &self,
        topic: &str,
        receipt_handles: &[String],
    ) -> Result<Vec<AckResult>, Error> {
        self.settle_batch(topic, receipt_handles, Settle::Extend)
            .await
    }

    /// Batch nack.
    pub async fn nack_batch(
        &self,
        topic: &str,
        receipt_handles: &[String],
    ) -> Result<Vec<AckResult>, Error> {
        self.settle_batch(topic, receipt_handles, Settle::Nack)
            .await
    }

    // ---- child topics (§3.7) ----

    /// `POST /v1/topics/{parent}/children` → `200` parent record.
    pub async fn attach_child(
        &self,
        parent: &str,
        req: &AttachChildRequest,
    ) -> Result<TopicRecord, Error> {
        let path = format!("{}/children", Self::topic_path(parent));
        let (_, b) = self
            .send_json(Method::POST, &path, req, self.control_timeout(), &[200])
            .await?;
        Self::decode(&b)
    }

    /// `GET /v1/topics/{parent}/children`.
    pub async fn list_children(&self, parent: &str) -> Result<ChildList, Error> {
        self.get_json(&format!("{}/children", Self::topic_path(parent)))
            .await
    }

    /// `DELETE /v1/topics/{parent}/children/{child}` → `204`.
    pub async fn detach_child(&self, parent: &str, child: &str) -> Result<(), Error> {
        let path = format!("{}/children/{}", Self::topic_path(parent), escape(child));
        self.send(Method::DELETE, &path, None, self.control_timeout(), &[204])
            .await?;
        Ok(())
    }

    // ---- users and grants (§3.8) ----

    /// `POST /v1/users` → `201` user.
    pub async fn create_user(&self, req: &CreateUserRequest) -> Result<User, Error> {
        let (_, b) = self
            .send_json(
                Method::POST,
                "/v1/users",
                req,
                self.control_timeout(),
                &[201],
            )
            .await?;
        Self::decode(&b)
    }

    /// `GET /v1/users`.
    pub async fn list_users(&self) -> Result<Vec<User>, Error> {
        self.get_json("/v1/users").await
    }

    /// `GET /v1/users/{u}`.
    pub async fn get_user(&self, username: &str) -> Result<User, Error> {
        self.get_json(&format!("/v1/users/{}", escape(username)))
            .await
    }

    /// `PUT /v1/users/{u}/grants` (replaces all) → `200` user.
    pub async fn put_grants(&self, username: &str, grants: &[Grant]) -> Result<User, Error> {
        let path = format!("/v1/users/{}/grants", escape(username));
        let body = PutGrantsRequest {
            grants: grants.to_vec(),
        };
        let (_, b) = self
            .send_json(Method::PUT, &path, &body, self.control_timeout(), &[200])
            .await?;
        Self::decode(&b)
    }

    /// (ext) `PUT /v1/users/{u}/quotas` (replaces all; `Quotas::default()` lifts them) →
    /// `200` user.
    pub async fn put_quotas(&self, username: &str, quotas: &Quotas) -> Result<User, Error> {
        let path = format!("/v1/users/{}/quotas", escape(username));
        let (_, b) = self
            .send_json(Method::PUT, &path, quotas, self.control_timeout(), &[200])
            .await?;
        Self::decode(&b)
    }

    /// `PUT /v1/users/{u}/password` → `204`. `current` is needed to change one's own.
    pub async fn set_password(
        &self,
        username: &str,
        current: Option<&str>,
        new: &str,
    ) -> Result<(), Error> {
        let path = format!("/v1/users/{}/password", escape(username));
        let body = PasswordRequest {
            current_password: current.map(str::to_string),
            new_password: new.to_string(),
        };
        self.send_json(Method::PUT, &path, &body, self.control_timeout(), &[204])
            .await?;
        Ok(())
    }

    /// `DELETE /v1/users/{u}` → `204`.
    pub async fn delete_user(&self, username: &str) -> Result<(), Error> {
        let path = format!("/v1/users/{}", escape(username));
        self.send(Method::DELETE, &path, None, self.control_timeout(), &[204])
            .await?;
        Ok(())
    }

    // ---- cluster (§3.9) ----

    /// `GET /v1/cluster/members` (sorted by id).
    pub async fn members(&self) -> Result<Vec<MemberInfo>, Error> {
        let l: MemberList = self.get_json("/v1/cluster/members").await?;
        Ok(l.members)
    }

    /// `GET /v1/cluster/moves`.
    pub async fn moves(&self) -> Result<Vec<MoveInfo>, Error> {
        let l: MoveList = self.get_json("/v1/cluster/moves").await?;
        Ok(l.moves)
    }

    /// `POST /v1/cluster/members/{id}/decommission` → `204` (starts draining).
    pub async fn decommission(&self, id: &str) -> Result<(), Error> {
        let path = format!("/v1/cluster/members/{}/decommission", escape(id));
        self.send(
            Method::POST,
            &path,
            Some((Bytes::new(), "application/json")),
            self.control_timeout(),
            &[204],
        )
        .await?;
        Ok(())
    }

    /// `DELETE /v1/cluster/members/{id}/decommission` → `204` (cancels draining).
    pub async fn cancel_decommission(&self, id: &str) -> Result<(), Error> {
        let path = format!("/v1/cluster/members/{}/decommission", escape(id));
        self.send(Method::DELETE, &path, None, self.control_timeout(), &[204])
            .await?;
        Ok(())
    }

    // ---- probes (§3.10) ----

    /// `GET /healthz` → `{"status":"ok"}`; `503` (shutting down) is an error.
    pub async fn healthz(&self) -> Result<StatusBody, Error> {
        self.get_json("/healthz").await
    }

    /// `GET /readyz` → `{"status":"ready"}`; `503` is an error carrying the reason.
    pub async fn readyz(&self) -> Result<StatusBody, Error> {
        self.get_json("/readyz").await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls() {
        assert_eq!(
            normalize_base_url("127.0.0.1:7942").unwrap(),
            "http://127.0.0.1:7942"
        );
        assert_eq!(normalize_base_url("http://h:1/").unwrap(), "http://h:1");
        assert_eq!(
            normalize_base_url(" https://h.example.com ").unwrap(),
            "https://h.example.com"
        );
        assert_eq!(
            normalize_base_url("http://h:1/prefix/").unwrap(),
            "http://h:1/prefix"
        );
        assert!(normalize_base_url("").is_err());
        assert!(normalize_base_url("ftp://h").is_err());
        assert!(normalize_base_url("http://").is_err());
        assert!(normalize_base_url("http://h?x=1").is_err());
    }

    #[test]
    fn escaping() {
        assert_eq!(escape("orders-1.x_y~"), "orders-1.x_y~");
        assert_eq!(escape("a/b c+d"), "a%2Fb%20c%2Bd");
        assert_eq!(escape_bytes(&[0xff, b'a', b'&', b'=']), "%FFa%26%3D");
        assert_eq!(escape("1:42:1767225600000001"), "1%3A42%3A1767225600000001");
    }

    #[test]
    fn paths() {
        assert_eq!(
            Client::consume_path("t", Some(Duration::from_secs(10)), Some(2), None),
            "/v1/topics/t/consume?partition=2&wait=10s"
        );
        assert_eq!(
            Client::consume_path("t", Some(Duration::ZERO), None, Some(100)),
            "/v1/topics/t/consume?max=100"
        );
        let mut q = Query::default();
        q.opt("extend", Settle::Nack.query())
            .push("receipt_handle", "1:2:3");
        assert_eq!(q.0, "?extend=0&receipt_handle=1%3A2%3A3");
    }

    #[test]
    fn batch_elements() {
        let m = batch_message(br#"{"a":1}"#, Some(b"k"), Some(2));
        assert_eq!(
            serde_json::to_string(&m).unwrap(),
            r#"{"payload":{"a":1},"key":"k","partition":2}"#
        );
        let m = batch_message(&[0, 1, 2], Some(&[0xff]), None);
        assert_eq!(
            serde_json::to_string(&m).unwrap(),
            r#"{"payload":"AAEC","payload_encoding":"base64","key":"/w==","key_encoding":"base64"}"#
        );
    }

    #[tokio::test]
    async fn transport_error_message() {
        // Port 1 on loopback: nothing listens there.
        let c = Client::new("127.0.0.1:1", None).unwrap();
        let e = c.healthz().await.unwrap_err();
        assert!(e.is_transport(), "{e}");
        assert!(e.is_retryable());
        assert!(
            e.to_string()
                .starts_with("cannot connect to http://127.0.0.1:1"),
            "{e}"
        );
    }
}
