//! Remote child links (SPEC §5.5): the HTTP side of a cursor that copies into a topic of
//! another Narad cluster through its public API.
//!
//! A cursor commits by `POST {url}/v1/topics/{topic}/produce/batch` (≤ 100 messages, body
//! ≤ 1 MiB, each record's key and exact payload, no partition), falling back to single
//! `produce` when the remote does not know the batch route (`404`/`405` while a single
//! produce succeeds), and advances only after `202`. What every other answer means is
//! [`classify`]; the waits are [`Backoff`] (retrying) and [`BLOCKED_RETRY`] (blocked).
//!
//! The client speaks HTTP/1.1 over plain TCP or rustls (ring), verifying https against the
//! system roots plus the link's optional `ca_pem`. Credentials live only in the link's
//! metadata and in a sensitive `Authorization` header value: never logged, never returned.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER, USER_AGENT};
use http::{Method, Request, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::connect::dns::Name;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use narad_meta::RemoteEndpoint;
use narad_storage::StoredRecord;
use percent_encoding::{percent_encode, utf8_percent_encode, NON_ALPHANUMERIC};
use rustls::pki_types::CertificateDer;
use serde_json::value::RawValue;

use crate::clock::now_ms;

/// Most messages in one remote batch produce (SPEC §3.4, §11).
pub const BATCH_MAX_MESSAGES: usize = 100;
/// Largest JSON body the remote accepts (SPEC §3.1).
pub const BATCH_MAX_BODY: usize = 1 << 20;
/// First wait after a retryable failure; doubles up to [`RETRY_MAX`].
pub const RETRY_MIN: Duration = Duration::from_secs(1);
pub const RETRY_MAX: Duration = Duration::from_secs(30);
/// How often a blocked link tries again.
pub const BLOCKED_RETRY: Duration = Duration::from_secs(30);
/// One request's budget, connect included.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest `Retry-After` honoured (a remote asking for more is asked again then).
const RETRY_AFTER_MAX: Duration = Duration::from_secs(600);
/// After the remote turned out not to have the batch route, how long single produce is used
/// before the batch route is tried again (the remote may be upgraded meanwhile).
const SINGLE_MODE_FOR_MS: u64 = 10 * 60 * 1000;
/// Most bytes of an error body read (the message goes to `last_error`).
const ERROR_BODY_MAX: usize = 64 * 1024;
/// Longest `last_error` text.
const LAST_ERROR_MAX: usize = 300;
const CLIENT_NAME: &str = concat!("narad-remote-child/", env!("CARGO_PKG_VERSION"));
const JSON_OVERHEAD: usize = r#"{"messages":[]}"#.len();

/// A link configuration that cannot work (answered `400` at attach).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RemoteConfigError {
    #[error("remote.url {0}")]
    Url(String),
    #[error("remote.ca_pem {0}")]
    Ca(String),
    #[error("remote TLS setup failed: {0}")]
    Tls(String),
}

/// The host of a URL [`normalize_url`] accepted (IPv6 in brackets, as written).
pub fn url_host(url: &str) -> String {
    url.parse::<Uri>()
        .ok()
        .and_then(|u| u.host().map(str::to_string))
        .unwrap_or_default()
}

/// A remote's base URL, checked: `http`/`https`, a host, optional port and path prefix; no
/// credentials (they go in `username`/`password`), query or fragment. Returned as given
/// without trailing `/`.
pub fn normalize_url(url: &str) -> Result<String, RemoteConfigError> {
    let bad = |why: &str| Err(RemoteConfigError::Url(why.to_string()));
    if url.is_empty() {
        return bad("is required");
    }
    if url.contains('#') || url.contains('?') {
        return bad("must not have a query or fragment");
    }
    let uri: Uri = match url.parse() {
        Ok(u) => u,
        Err(e) => return Err(RemoteConfigError::Url(format!("is not a valid URL: {e}"))),
    };
    match uri.scheme_str() {
        Some(s) if s.eq_ignore_ascii_case("http") || s.eq_ignore_ascii_case("https") => {}
        Some(_) => return bad("must be an http or https URL"),
        None => return bad("must be an absolute http or https URL"),
    }
    let Some(authority) = uri.authority() else {
        return bad("must name a host");
    };
    if authority.as_str().contains('@') {
        return bad("must not carry credentials; use remote.username and remote.password");
    }
    if authority.host().is_empty() {
        return bad("must name a host");
    }
    // `Authority::port` hides a port that is not a u16; look at the text.
    let a = authority.as_str();
    let host_end = if a.starts_with('[') {
        a.find(']').map_or(a.len(), |i| i + 1)
    } else {
        a.find(':').unwrap_or(a.len())
    };
    let rest = &a[host_end..];
    if !rest.is_empty() {
        match rest.strip_prefix(':').and_then(|p| p.parse::<u16>().ok()) {
            Some(p) if p > 0 => {}
            _ => return bad("has an invalid port"),
        }
    }
    // As given (clients compare it with what they sent), without the trailing `/`.
    Ok(url.trim_end_matches('/').to_string())
}

/// The trust anchors of a PEM bundle (at least one certificate, each usable as a CA).
pub fn parse_ca_pem(pem: &str) -> Result<rustls::RootCertStore, RemoteConfigError> {
    let mut roots = rustls::RootCertStore::empty();
    narad_api::client::add_ca_pem(&mut roots, pem.as_bytes()).map_err(RemoteConfigError::Ca)?;
    Ok(roots)
}

/// The system's trusted roots, loaded once per process.
fn system_roots() -> &'static [CertificateDer<'static>] {
    static ROOTS: OnceLock<Vec<CertificateDer<'static>>> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let found = rustls_native_certs::load_native_certs();
        if !found.errors.is_empty() {
            tracing::warn!(errors = found.errors.len(), loaded = found.certs.len(),
                first = %found.errors[0], "some system CA certificates could not be loaded");
        }
        found.certs
    })
}

/// The state of a link's cursor (SPEC §3.7 `state`), ordered by severity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LinkState {
    Ok,
    Retrying,
    Blocked,
}

impl LinkState {
    pub fn parse(s: &str) -> Option<LinkState> {
        match s {
            "ok" => Some(LinkState::Ok),
            "retrying" => Some(LinkState::Retrying),
            "blocked" => Some(LinkState::Blocked),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            LinkState::Ok => "ok",
            LinkState::Retrying => "retrying",
            LinkState::Blocked => "blocked",
        }
    }
}

/// A cursor's view of its link: `state` and the `last_error` that put it there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkStatus {
    pub state: LinkState,
    pub last_error: Option<String>,
}

impl Default for LinkStatus {
    fn default() -> Self {
        LinkStatus {
            state: LinkState::Ok,
            last_error: None,
        }
    }
}

/// The worst of several cursors' statuses (a link is as healthy as its sickest partition).
pub fn worst<'a>(statuses: impl IntoIterator<Item = &'a LinkStatus>) -> Option<LinkStatus> {
    statuses.into_iter().max_by_key(|s| s.state).cloned()
}

/// What an answer of the remote means for the records sent (SPEC §5.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// `202`: durable there; advance.
    Accepted,
    /// `404`/`405` to a batch: the remote may not have the batch route; try the first
    /// record as a single produce (which tells a missing route from a missing topic).
    NoBatchRoute,
    /// `400`/`413` to a batch: send its records one by one.
    OneByOne,
    /// `400`/`413` to a single record: it is refused alone; skip it (counted as dropped).
    Skip,
    /// `429`, `5xx`, `408`, timeouts, network errors: back off and retry (`retrying`).
    Retry { after: Option<Duration> },
    /// `401`, `403`, `404`, `409` and anything unexpected: retry every 30 s, skip nothing
    /// (`blocked`).
    Block,
}

/// SPEC §5.5: the meaning of status `status` answered to a batch (`batch`) or a single
/// produce, with the answer's `Retry-After`.
pub fn classify(status: u16, batch: bool, retry_after: Option<Duration>) -> Verdict {
    match status {
        202 => Verdict::Accepted,
        404 | 405 if batch => Verdict::NoBatchRoute,
        400 | 413 if batch => Verdict::OneByOne,
        400 | 413 => Verdict::Skip,
        408 | 429 | 500..=599 => Verdict::Retry { after: retry_after },
        // 401, 403, 404, 405 (single), 409, other 2xx, 3xx (never followed), other 4xx:
        // nothing is known to have been stored, and nothing may be skipped.
        _ => Verdict::Block,
    }
}

/// The `reason` label of `remote_child_send_errors_total` for a failed answer.
pub fn error_reason(status: u16) -> &'static str {
    match status {
        400 | 413 => "rejected",
        401 => "unauthorized",
        403 => "forbidden",
        404 => "not_found",
        405 => "method_not_allowed",
        408 => "timeout",
        409 => "conflict",
        429 => "throttled",
        500..=599 => "server_error",
        _ => "unexpected_status",
    }
}

/// Backoff of a retrying link: 1 s doubling to 30 s; a `Retry-After` longer than the
/// current step is honoured.
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff { next: RETRY_MIN }
    }
}

impl Backoff {
    /// The wait before the next attempt (and doubles the step).
    pub fn delay(&mut self, retry_after: Option<Duration>) -> Duration {
        let step = self.next;
        self.next = (self.next * 2).min(RETRY_MAX);
        match retry_after {
            Some(ra) => step.max(ra.min(RETRY_AFTER_MAX)),
            None => step,
        }
    }
    pub fn reset(&mut self) {
        self.next = RETRY_MIN;
    }
}

/// `Retry-After` as delta seconds (an HTTP date is not used: clocks differ).
pub fn parse_retry_after(v: Option<&HeaderValue>) -> Option<Duration> {
    let secs: u64 = v?.to_str().ok()?.trim().parse().ok()?;
    (secs > 0).then(|| Duration::from_secs(secs))
}

/// The message of an error body: `{"error": …}` if it is one, else the trimmed text.
pub fn error_message(body: &[u8]) -> String {
    #[derive(serde::Deserialize)]
    struct E {
        error: String,
    }
    let text = match serde_json::from_slice::<E>(body) {
        Ok(e) => e.error,
        Err(_) => String::from_utf8_lossy(body).trim().to_string(),
    };
    truncate(text, LAST_ERROR_MAX)
}

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push('…');
    }
    s
}

/// A remote's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    /// The error message (empty for `202`).
    pub message: String,
    pub retry_after: Option<Duration>,
}

impl Answer {
    /// `last_error` text, e.g. `401 authentication required`.
    pub fn describe(&self) -> String {
        if self.message.is_empty() {
            self.status.to_string()
        } else {
            format!("{} {}", self.status, self.message)
        }
    }
}

/// No answer came (network error, TLS failure, timeout): always retried.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RemoteSendError {
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("network error: {0}")]
    Network(String),
    /// This node's remote-host policy refuses the host.
    #[error("{0}")]
    Refused(String),
}

impl RemoteSendError {
    pub fn reason(&self) -> &'static str {
        match self {
            RemoteSendError::Timeout(_) => "timeout",
            RemoteSendError::Network(_) => "network",
            RemoteSendError::Refused(_) => "refused",
        }
    }
}

type HttpsClient =
    Client<hyper_rustls::HttpsConnector<HttpConnector<GuardedResolver>>, Full<Bytes>>;

/// The system resolver, less the addresses no link may reach ([`super::hosts::reachable`]):
/// a host name that resolves to an instance metadata service fails the request.
#[derive(Clone, Copy, Debug, Default)]
pub struct GuardedResolver;

impl tower::Service<Name> for GuardedResolver {
    type Response = std::vec::IntoIter<std::net::SocketAddr>;
    type Error = std::io::Error;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = std::io::Result<Self::Response>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        Box::pin(async move {
            let host = name.as_str().to_string();
            let found = tokio::net::lookup_host((host.as_str(), 0)).await?;
            Ok(super::hosts::reachable(&host, found)?.into_iter())
        })
    }
}

/// The HTTP client of one remote link on this node, shared by the link's cursors.
pub struct RemoteClient {
    /// `{url}/v1/topics/{topic}/produce`.
    produce_url: String,
    /// Remote `topic` (for logs).
    pub topic: String,
    /// Base URL (for logs; never carries credentials).
    pub url: String,
    auth: Option<HeaderValue>,
    client: HttpsClient,
    /// Until when (ms) single produce is used because the batch route was missing.
    single_until_ms: AtomicU64,
    /// Why this node's remote-host policy refuses the link's host, if it does: nothing is
    /// sent, and every attempt fails with this (the link's `last_error`).
    refused: Option<String>,
}

impl RemoteClient {
    /// The client of `endpoint`, sending with `password` (opened from its sealed form by the
    /// caller). A host `hosts` refuses, or a password that did not open, makes a client that
    /// sends nothing and fails every attempt with the reason (the link's `last_error`).
    pub fn new(
        endpoint: &RemoteEndpoint,
        hosts: &super::hosts::HostPolicy,
        password: Result<Option<String>, crate::security::sealing::SealError>,
    ) -> Result<Arc<RemoteClient>, RemoteConfigError> {
        let url = normalize_url(&endpoint.url)?;
        let (password, sealing) = match password {
            Ok(p) => (p, None),
            Err(e) => (None, Some(e.to_string())),
        };
        let refused = hosts
            .check(&url_host(&url))
            .err()
            .map(|e| e.to_string())
            .or(sealing);
        let mut roots = rustls::RootCertStore::empty();
        roots.add_parsable_certificates(system_roots().iter().cloned());
        if let Some(pem) = &endpoint.ca_pem {
            roots.roots.extend(parse_ca_pem(pem)?.roots);
        }
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| RemoteConfigError::Tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
        let mut http = HttpConnector::new_with_resolver(GuardedResolver);
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(CONNECT_TIMEOUT));
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(8)
            .build(https);
        let auth = match (&endpoint.username, &password) {
            (Some(u), p) if !u.is_empty() => {
                let token = base64::engine::general_purpose::STANDARD
                    .encode(format!("{u}:{}", p.as_deref().unwrap_or("")));
                let mut v = HeaderValue::from_str(&format!("Basic {token}"))
                    .map_err(|e| RemoteConfigError::Tls(format!("credentials: {e}")))?;
                v.set_sensitive(true);
                Some(v)
            }
            _ => None,
        };
        Ok(Arc::new(RemoteClient {
            produce_url: format!(
                "{url}/v1/topics/{}/produce",
                utf8_percent_encode(&endpoint.topic, NON_ALPHANUMERIC)
            ),
            topic: endpoint.topic.clone(),
            url,
            auth,
            client,
            single_until_ms: AtomicU64::new(0),
            refused,
        }))
    }

    /// Whether records go one by one because the remote lacks the batch route.
    pub fn single_mode(&self) -> bool {
        self.single_until_ms.load(Ordering::Acquire) > now_ms()
    }

    pub fn set_single_mode(&self) {
        self.single_until_ms
            .store(now_ms() + SINGLE_MODE_FOR_MS, Ordering::Release);
    }

    /// `POST …/produce/batch` with a body built by [`BatchBody`].
    pub async fn send_batch(&self, body: Bytes) -> Result<Answer, RemoteSendError> {
        self.post(
            format!("{}/batch", self.produce_url),
            "application/json",
            body,
        )
        .await
    }

    /// `POST …/produce[?key=K]` with the payload as the body.
    pub async fn send_single(&self, rec: &StoredRecord) -> Result<Answer, RemoteSendError> {
        let url = match rec.key.as_deref() {
            Some(k) if !k.is_empty() => {
                format!(
                    "{}?key={}",
                    self.produce_url,
                    percent_encode(k, NON_ALPHANUMERIC)
                )
            }
            _ => self.produce_url.clone(),
        };
        self.post(url, "application/octet-stream", rec.payload.clone())
            .await
    }

    async fn post(
        &self,
        url: String,
        content_type: &'static str,
        body: Bytes,
    ) -> Result<Answer, RemoteSendError> {
        if let Some(why) = &self.refused {
            return Err(RemoteSendError::Refused(why.clone()));
        }
        let mut req = Request::builder()
            .method(Method::POST)
            .uri(url)
            .header(CONTENT_TYPE, content_type)
            .header(USER_AGENT, CLIENT_NAME)
            .header("x-narad-client", CLIENT_NAME);
        if let Some(a) = &self.auth {
            req = req.header(AUTHORIZATION, a.clone());
        }
        let req = req
            .body(Full::new(body))
            .map_err(|e| RemoteSendError::Network(format!("cannot build the request: {e}")))?;
        let exchange = async {
            let resp = self
                .client
                .request(req)
                .await
                .map_err(|e| RemoteSendError::Network(describe_client_error(&e)))?;
            let status = resp.status().as_u16();
            let retry_after = parse_retry_after(resp.headers().get(RETRY_AFTER));
            // Read the body (so the connection is reused); a 202's content does not matter.
            let body = Limited::new(resp.into_body(), ERROR_BODY_MAX)
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            let message = if status == 202 {
                String::new()
            } else {
                error_message(&body)
            };
            Ok(Answer {
                status,
                message,
                retry_after,
            })
        };
        match tokio::time::timeout(REQUEST_TIMEOUT, exchange).await {
            Ok(r) => r,
            Err(_) => Err(RemoteSendError::Timeout(REQUEST_TIMEOUT)),
        }
    }
}

/// The innermost cause of a client error (e.g. `connection refused`), which is what an
/// operator needs in `last_error`.
fn describe_client_error(e: &hyper_util::client::legacy::Error) -> String {
    let mut msg = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        msg = s.to_string();
        src = s.source();
    }
    truncate(msg, LAST_ERROR_MAX)
}

/// Builds batch produce bodies (CLIENT-COMPAT §2.2): a payload that is one JSON value
/// without surrounding whitespace is sent raw (stored as exactly those bytes), anything
/// else as standard base64 with `payload_encoding`; a UTF-8 key as a JSON string, any
/// other as base64 with `key_encoding`; never a partition. The buffers are reused.
#[derive(Default)]
pub struct BatchBody {
    buf: Vec<u8>,
    one: Vec<u8>,
}

impl BatchBody {
    /// Encodes the longest prefix of `records` that fits one batch (≤ 100 messages, body
    /// ≤ 1 MiB) and returns its length; 0 when the first record alone does not fit (it
    /// must go as a single produce).
    pub fn fill(&mut self, records: &[StoredRecord]) -> usize {
        self.buf.clear();
        self.buf.extend_from_slice(br#"{"messages":["#);
        let mut n = 0;
        for r in records.iter().take(BATCH_MAX_MESSAGES) {
            self.one.clear();
            encode_message(&mut self.one, r);
            let sep = usize::from(n > 0);
            if self.buf.len() + sep + self.one.len() + 2 > BATCH_MAX_BODY {
                break;
            }
            if n > 0 {
                self.buf.push(b',');
            }
            self.buf.extend_from_slice(&self.one);
            n += 1;
        }
        self.buf.extend_from_slice(b"]}");
        n
    }

    /// The body of the last [`BatchBody::fill`].
    pub fn bytes(&self) -> Bytes {
        Bytes::copy_from_slice(&self.buf)
    }

    /// The size a lone record takes in a batch body (for tests and sizing).
    pub fn encoded_len(r: &StoredRecord) -> usize {
        let mut v = Vec::new();
        encode_message(&mut v, r);
        v.len() + JSON_OVERHEAD
    }
}

/// One batch-produce element carrying the record's payload, key and attributes as stored.
fn encode_message(out: &mut Vec<u8>, r: &StoredRecord) {
    let (key, payload) = (r.key.as_deref(), &r.payload[..]);
    out.extend_from_slice(br#"{"payload":"#);
    if is_bare_json(payload) {
        out.extend_from_slice(payload);
    } else {
        out.push(b'"');
        push_base64(out, payload);
        out.extend_from_slice(br#"","payload_encoding":"base64""#);
    }
    match key {
        Some(k) if !k.is_empty() => {
            out.extend_from_slice(br#","key":"#);
            match std::str::from_utf8(k) {
                Ok(s) => {
                    serde_json::to_writer(&mut *out, s)
                        .expect("invariant: writing a string into a Vec cannot fail");
                }
                Err(_) => {
                    out.push(b'"');
                    push_base64(out, k);
                    out.extend_from_slice(br#"","key_encoding":"base64""#);
                }
            }
        }
        _ => {}
    }
    // The broker's own attributes (a dead-lettered copy's source) stay here: a remote refuses
    // them from a producer.
    if let Some(a) = crate::attrs::without_reserved(r.attrs.as_ref()) {
        crate::attrs::write_json(out, &a);
    }
    out.push(b'}');
}

/// Whether `payload` is exactly one JSON value with no whitespace around it, so that
/// embedding it raw stores exactly these bytes on the remote.
pub fn is_bare_json(payload: &[u8]) -> bool {
    match payload.first() {
        None => return false,
        Some(b) if b.is_ascii_whitespace() => return false,
        _ => {}
    }
    if payload.last().is_some_and(|b| b.is_ascii_whitespace()) {
        return false;
    }
    serde_json::from_slice::<&RawValue>(payload).is_ok_and(|v| v.get().len() == payload.len())
}

/// Appends standard base64 (with padding) of `input` to `out`.
fn push_base64(out: &mut Vec<u8>, input: &[u8]) {
    let start = out.len();
    let len = base64::encoded_len(input.len(), true).expect("invariant: a record fits memory");
    out.resize(start + len, 0);
    let n = base64::engine::general_purpose::STANDARD
        .encode_slice(input, &mut out[start..])
        .expect("invariant: the buffer has the encoded length");
    out.truncate(start + n);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::SEND_ERROR_REASONS;
    use rustls::pki_types::pem::PemObject;

    #[test]
    fn every_send_error_reason_is_listed() {
        for status in 0..1000u16 {
            let r = error_reason(status);
            assert!(SEND_ERROR_REASONS.contains(&r), "{status} → {r}");
        }
        for e in [
            RemoteSendError::Timeout(Duration::from_secs(1)),
            RemoteSendError::Network(String::new()),
        ] {
            assert!(SEND_ERROR_REASONS.contains(&e.reason()), "{e}");
        }
    }

    fn rec(offset: u64, key: Option<&[u8]>, payload: &[u8]) -> StoredRecord {
        StoredRecord {
            offset,
            timestamp_ms: 0,
            key: key.map(Bytes::copy_from_slice),
            payload: Bytes::copy_from_slice(payload),
            attrs: None,
        }
    }

    #[test]
    fn a_remote_copy_carries_the_attributes_as_the_batch_produce_reads_them() {
        let mut r = rec(0, Some(b"k"), b"{\"a\":1}");
        let mut b = crate::attrs::Builder::default();
        b.push("traceparent", "00-1-2-01").unwrap();
        r.attrs = b.finish();
        let mut out = Vec::new();
        encode_message(&mut out, &r);
        let m: narad_api::BatchMessage = serde_json::from_slice(&out).unwrap();
        let attrs = m.attributes.unwrap();
        assert_eq!(attrs["traceparent"], "00-1-2-01");
        assert_eq!(m.key.as_deref(), Some("k"));
        // The broker's own attributes stay behind; with nothing else, no attributes at all.
        r.attrs = crate::attrs::with_reserved(
            r.attrs.as_deref(),
            &[("narad-dead-letter-source-topic", "t")],
        );
        out.clear();
        encode_message(&mut out, &r);
        let m: narad_api::BatchMessage = serde_json::from_slice(&out).unwrap();
        assert_eq!(m.attributes.unwrap().len(), 1);
        r.attrs = crate::attrs::with_reserved(None, &[("narad-dead-letter-source-topic", "t")]);
        out.clear();
        encode_message(&mut out, &r);
        assert_eq!(out, br#"{"payload":{"a":1},"key":"k"}"#);
        // Without attributes the element is as before.
        r.attrs = None;
        out.clear();
        encode_message(&mut out, &r);
        assert_eq!(out, br#"{"payload":{"a":1},"key":"k"}"#);
    }

    #[test]
    fn url_rules() {
        let ok = |u: &str| normalize_url(u).unwrap();
        assert_eq!(ok("https://dr.example.com"), "https://dr.example.com");
        assert_eq!(ok("http://127.0.0.1:7942/"), "http://127.0.0.1:7942");
        assert_eq!(ok("http://[::1]:7942"), "http://[::1]:7942");
        assert_eq!(
            ok("HTTPS://dr.example.com/narad/"),
            "HTTPS://dr.example.com/narad"
        );
        for bad in [
            "",
            "dr.example.com",
            "/v1/topics",
            "ftp://dr.example.com",
            "https://user:pw@dr.example.com",
            "https://dr.example.com/?x=1",
            "https://dr.example.com/#frag",
            "https://dr example.com",
            "https://dr.example.com:99999",
            "https://dr.example.com:0",
            "https://dr.example.com:x",
            "https://",
        ] {
            assert!(normalize_url(bad).is_err(), "{bad:?} must be refused");
        }
        // The refusal of a URL with credentials does not echo them.
        let e = normalize_url("https://user:pw@dr.example.com").unwrap_err();
        assert!(!e.to_string().contains("pw"), "{e}");
    }

    #[test]
    fn ca_pem_rules() {
        assert!(parse_ca_pem("").is_err());
        assert!(parse_ca_pem("not a pem").is_err());
        let garbage = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        assert!(parse_ca_pem(garbage).is_err(), "undecodable DER");
    }

    #[test]
    fn classify_follows_the_spec() {
        use Verdict::*;
        let ra = Some(Duration::from_secs(7));
        for batch in [true, false] {
            assert_eq!(classify(202, batch, None), Accepted);
            assert_eq!(classify(429, batch, ra), Retry { after: ra });
            for s in [500, 502, 503, 504, 408] {
                assert_eq!(classify(s, batch, None), Retry { after: None }, "{s}");
            }
            for s in [401, 403, 409, 200, 201, 204, 301, 410, 415] {
                assert_eq!(classify(s, batch, None), Block, "{s} batch={batch}");
            }
        }
        // Batch: 404/405 may be a missing route; 400/413 split one by one.
        assert_eq!(classify(404, true, None), NoBatchRoute);
        assert_eq!(classify(405, true, None), NoBatchRoute);
        assert_eq!(classify(400, true, None), OneByOne);
        assert_eq!(classify(413, true, None), OneByOne);
        // Single: a missing topic blocks; a record refused alone is skipped.
        assert_eq!(classify(404, false, None), Block);
        assert_eq!(classify(405, false, None), Block);
        assert_eq!(classify(400, false, None), Skip);
        assert_eq!(classify(413, false, None), Skip);
        assert_eq!(error_reason(401), "unauthorized");
        assert_eq!(error_reason(503), "server_error");
        assert_eq!(error_reason(429), "throttled");
    }

    #[test]
    fn backoff_doubles_to_30s_and_honours_retry_after() {
        let mut b = Backoff::default();
        let steps: Vec<u64> = (0..8).map(|_| b.delay(None).as_secs()).collect();
        assert_eq!(steps, [1, 2, 4, 8, 16, 30, 30, 30]);
        b.reset();
        assert_eq!(b.delay(None), Duration::from_secs(1));
        // A longer Retry-After wins; a shorter one does not shorten the backoff.
        assert_eq!(
            b.delay(Some(Duration::from_secs(20))),
            Duration::from_secs(20)
        );
        assert_eq!(
            b.delay(Some(Duration::from_secs(1))),
            Duration::from_secs(4)
        );
        // An absurd one is capped.
        assert_eq!(b.delay(Some(Duration::from_secs(86_400))), RETRY_AFTER_MAX);
        assert_eq!(
            parse_retry_after(Some(&HeaderValue::from_static("3"))),
            Some(Duration::from_secs(3))
        );
        assert_eq!(
            parse_retry_after(Some(&HeaderValue::from_static("0"))),
            None
        );
        assert_eq!(
            parse_retry_after(Some(&HeaderValue::from_static(
                "Wed, 21 Oct 2015 07:28:00 GMT"
            ))),
            None
        );
        assert_eq!(parse_retry_after(None), None);
    }

    #[test]
    fn worst_state_wins() {
        let s = |state, e: Option<&str>| LinkStatus {
            state,
            last_error: e.map(str::to_string),
        };
        assert_eq!(worst(&[]), None);
        let all = [
            s(LinkState::Ok, None),
            s(LinkState::Blocked, Some("401 authentication required")),
            s(LinkState::Retrying, Some("503 x")),
        ];
        assert_eq!(worst(&all), Some(all[1].clone()));
        assert_eq!(LinkState::Blocked.as_str(), "blocked");
    }

    #[test]
    fn error_messages() {
        assert_eq!(
            error_message(br#"{"error":"authentication required"}"#),
            "authentication required"
        );
        assert_eq!(error_message(b"  Bad Gateway \n"), "Bad Gateway");
        let long = "é".repeat(400);
        let m = error_message(long.as_bytes());
        assert!(m.len() <= LAST_ERROR_MAX + "…".len() && m.ends_with('…'));
        let a = Answer {
            status: 401,
            message: "authentication required".into(),
            retry_after: None,
        };
        assert_eq!(a.describe(), "401 authentication required");
    }

    #[test]
    fn batch_bodies_keep_keys_and_exact_payloads() {
        let recs = [
            rec(0, Some(b"cust-7"), br#"{"a":1}"#),
            rec(1, None, b"plain text"),
            rec(2, Some(&[0xff, 0x00]), &[0, 1, 2]),
            rec(3, Some(b"q\"uote"), b" {\"padded\":true}"),
            rec(4, None, br#""a json string""#),
            rec(5, Some(b""), b"42"),
        ];
        let mut b = BatchBody::default();
        assert_eq!(b.fill(&recs), 6);
        let body = b.bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let m = v["messages"].as_array().unwrap();
        assert_eq!(m.len(), 6);
        // Raw JSON stays raw (the exact bytes appear in the body).
        let raw = br#"{"payload":{"a":1}"#;
        assert!(body.windows(raw.len()).any(|w| w == raw));
        assert_eq!(m[0]["key"], "cust-7");
        assert!(m[0].get("payload_encoding").is_none());
        assert_eq!(m[1]["payload"], "cGxhaW4gdGV4dA==");
        assert_eq!(m[1]["payload_encoding"], "base64");
        assert!(m[1].get("key").is_none());
        assert_eq!(m[2]["payload"], "AAEC");
        assert_eq!(m[2]["key"], "/wA=");
        assert_eq!(m[2]["key_encoding"], "base64");
        assert_eq!(m[3]["key"], "q\"uote");
        assert_eq!(
            m[3]["payload_encoding"], "base64",
            "whitespace: not bare JSON"
        );
        assert_eq!(m[4]["payload"], "a json string");
        assert!(m[4].get("payload_encoding").is_none());
        assert!(m[5].get("key").is_none(), "an empty key is no key");
        for x in m {
            assert!(x.get("partition").is_none());
        }
    }

    #[test]
    fn batch_bodies_respect_count_and_size_limits() {
        let small: Vec<StoredRecord> = (0..250).map(|i| rec(i, None, b"1")).collect();
        let mut b = BatchBody::default();
        assert_eq!(b.fill(&small), BATCH_MAX_MESSAGES);
        assert_eq!(b.fill(&small[200..]), 50);
        // 300 KiB binary payloads: base64 makes each 400 KiB; two fit 1 MiB, three do not.
        let big: Vec<StoredRecord> = (0..5)
            .map(|i| rec(i, None, &vec![0u8; 300 * 1024]))
            .collect();
        assert_eq!(b.fill(&big), 2);
        assert!(b.bytes().len() <= BATCH_MAX_BODY);
        // A record that cannot fit a batch body alone: 0 (it goes as a single produce).
        let huge = [rec(0, None, &vec![0u8; 1 << 20])];
        assert!(BatchBody::encoded_len(&huge[0]) > BATCH_MAX_BODY);
        assert_eq!(b.fill(&huge), 0);
    }

    #[test]
    fn bare_json_detection() {
        for yes in [
            &b"{}"[..],
            b"[1,2]",
            b"\"s\"",
            b"42",
            b"true",
            b"null",
            b"{\"a\": [1, 2]}",
        ] {
            assert!(is_bare_json(yes), "{:?}", String::from_utf8_lossy(yes));
        }
        for no in [
            &b""[..],
            b" {}",
            b"{} ",
            b"{}\n",
            b"{} {}",
            b"abc",
            b"{",
            &[0xff, 0xfe],
        ] {
            assert!(!is_bare_json(no), "{:?}", String::from_utf8_lossy(no));
        }
    }

    const TEST_CA: &str = include_str!("testdata/ca.pem");
    const TEST_CERT: &str = include_str!("testdata/server.pem");
    const TEST_KEY: &str = include_str!("testdata/server.key");

    /// A one-connection-at-a-time https server (certificate for `localhost`, signed by the
    /// test CA) answering every request `202`; returns its port.
    async fn tls_server() -> u16 {
        use rustls::pki_types::PrivateKeyDer;
        use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
        let certs = CertificateDer::pem_slice_iter(TEST_CERT.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_slice(TEST_KEY.as_bytes()).unwrap();
        let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((sock, _)) = l.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(sock).await else {
                        return;
                    };
                    let mut r = BufReader::new(tls);
                    loop {
                        let mut len = 0usize;
                        loop {
                            let mut line = String::new();
                            if r.read_line(&mut line).await.unwrap_or(0) == 0 {
                                return;
                            }
                            let l = line.trim_end().to_ascii_lowercase();
                            if l.is_empty() {
                                break;
                            }
                            if let Some(v) = l.strip_prefix("content-length:") {
                                len = v.trim().parse().unwrap_or(0);
                            }
                        }
                        let mut body = vec![0u8; len];
                        if r.read_exact(&mut body).await.is_err() {
                            return;
                        }
                        let resp = b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n";
                        if r.get_mut().write_all(resp).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        port
    }

    #[tokio::test]
    async fn https_trusts_the_given_ca_and_refuses_an_unknown_one() {
        let port = tls_server().await;
        let endpoint = |ca: Option<&str>| RemoteEndpoint {
            url: format!("https://localhost:{port}"),
            topic: "t".into(),
            username: None,
            password: None,
            ca_pem: ca.map(str::to_string),
        };
        assert_eq!(parse_ca_pem(TEST_CA).unwrap().len(), 1);
        let trusted =
            RemoteClient::new(&endpoint(Some(TEST_CA)), &Default::default(), Ok(None)).unwrap();
        let a = trusted
            .send_single(&rec(0, Some(b"k"), b"x"))
            .await
            .unwrap();
        assert_eq!(a.status, 202);
        let mut body = BatchBody::default();
        body.fill(&[rec(0, None, b"{}")]);
        assert_eq!(trusted.send_batch(body.bytes()).await.unwrap().status, 202);
        // Only the system roots: the test CA is unknown, the handshake fails (retried).
        let untrusted = RemoteClient::new(&endpoint(None), &Default::default(), Ok(None)).unwrap();
        let e = untrusted
            .send_single(&rec(0, None, b"x"))
            .await
            .unwrap_err();
        assert_eq!(e.reason(), "network", "{e}");
        assert!(e.to_string().to_lowercase().contains("certificate"), "{e}");
    }

    #[tokio::test]
    async fn client_sends_credentials_only_in_a_sensitive_header() {
        let c = RemoteClient::new(
            &RemoteEndpoint {
                url: "http://127.0.0.1:9/".into(),
                topic: "orders".into(),
                username: Some("replicator".into()),
                password: Some("s3cret-pw".into()),
                ca_pem: None,
            },
            &Default::default(),
            Ok(Some("s3cret-pw".into())),
        )
        .unwrap();
        assert_eq!(c.produce_url, "http://127.0.0.1:9/v1/topics/orders/produce");
        let auth = c.auth.as_ref().unwrap();
        assert!(auth.is_sensitive());
        assert!(!format!("{auth:?}").contains("cmVwbGljYXRvcjpzM2NyZXQtcHc"));
        assert_eq!(auth.to_str().unwrap(), "Basic cmVwbGljYXRvcjpzM2NyZXQtcHc=");
        // Nothing listens on port 9 (discard) here: a network error, retried.
        let e = c.send_single(&rec(0, Some(b"k"), b"x")).await.unwrap_err();
        assert_eq!(e.reason(), "network", "{e}");
        assert!(!c.single_mode());
        c.set_single_mode();
        assert!(c.single_mode());
    }

    #[tokio::test]
    async fn a_host_the_policy_refuses_gets_nothing_sent() {
        let ep = |url: &str| RemoteEndpoint {
            url: url.into(),
            topic: "orders".into(),
            username: Some("replicator".into()),
            password: Some("s3cret-pw".into()),
            ca_pem: None,
        };
        let only_10 = crate::children::hosts::HostPolicy::parse(["10.0.0.0/8"]).unwrap();
        let c = RemoteClient::new(&ep("http://127.0.0.1:9"), &only_10, Ok(None)).unwrap();
        let e = c.send_single(&rec(0, None, b"x")).await.unwrap_err();
        assert_eq!(e.reason(), "refused", "{e}");
        assert!(
            e.to_string()
                .contains("not in this node's remotes.allowed_hosts"),
            "{e}"
        );
        // Never, whatever the list says (a link attached before the rule).
        let any = crate::children::hosts::HostPolicy::parse(["*"]).unwrap();
        let c = RemoteClient::new(&ep("http://169.254.169.254"), &any, Ok(None)).unwrap();
        let e = c.send_single(&rec(0, None, b"x")).await.unwrap_err();
        assert_eq!(e.reason(), "refused", "{e}");
        // A name is resolved through the guard: localhost is allowed, and answers (nothing
        // listens on port 9: a network error, not a refusal).
        let c = RemoteClient::new(&ep("http://localhost:9"), &any, Ok(None)).unwrap();
        let e = c.send_single(&rec(0, None, b"x")).await.unwrap_err();
        assert_eq!(e.reason(), "network", "{e}");
        // A password that did not open: nothing sent, the reason on the link.
        let wrong = Err(crate::security::sealing::SealError::WrongKey);
        let c = RemoteClient::new(&ep("http://127.0.0.1:9"), &any, wrong).unwrap();
        let e = c.send_single(&rec(0, None, b"x")).await.unwrap_err();
        assert_eq!(e.reason(), "refused", "{e}");
        assert!(e.to_string().contains("cluster secret"), "{e}");
        assert_eq!(url_host("http://[::1]:80/x"), "[::1]");
    }
}
