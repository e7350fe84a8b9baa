//! Errors of the HTTP client.

use std::fmt;

/// A non-success answer of the server: its status, the message of its `{"error":…}` body (or
/// the trimmed body text when it is not that shape) and its `Retry-After` in seconds.
///
/// `Display` is `http <code>: <message>` (SPEC §7).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpError {
    pub status: u16,
    pub message: String,
    pub retry_after: Option<u64>,
}

impl HttpError {
    /// Builds the error from a status, a body and a `Retry-After` header value.
    pub fn from_body(status: u16, body: &[u8], retry_after: Option<&str>) -> HttpError {
        HttpError {
            status,
            message: error_message(body),
            retry_after: retry_after.and_then(|v| v.trim().parse::<u64>().ok()),
        }
    }

    /// Whether a retry may succeed: `429`, `5xx` (and `408`).
    pub fn is_retryable(&self) -> bool {
        matches!(self.status, 408 | 429) || self.status >= 500
    }
}

impl fmt::Display for HttpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.message.is_empty() {
            write!(f, "http {}", self.status)
        } else {
            write!(f, "http {}: {}", self.status, self.message)
        }
    }
}

impl std::error::Error for HttpError {}

/// The message of an error body: the `error` field of `{"error":"…"}`, else the `status` field
/// of `{"status":"…"}` (the `/healthz` shape), else the trimmed body text (at most 8 KiB).
pub fn error_message(body: &[u8]) -> String {
    #[derive(serde::Deserialize)]
    struct Shape {
        #[serde(default)]
        error: Option<String>,
        #[serde(default)]
        status: Option<String>,
    }
    if let Ok(shape) = serde_json::from_slice::<Shape>(body) {
        if let Some(e) = shape.error.filter(|e| !e.is_empty()) {
            return e;
        }
        if let Some(s) = shape.status.filter(|s| !s.is_empty()) {
            return s;
        }
    }
    let body = &body[..body.len().min(8192)];
    let text = String::from_utf8_lossy(body);
    // One line: error texts end up in `narad: <message>`.
    text.trim().replace(['\r', '\n'], " ")
}

/// Any failure of a client call.
#[derive(Debug)]
pub enum Error {
    /// The server answered with an unexpected status.
    Api(HttpError),
    /// The request could not be sent or the answer not received (connect, timeout, reset).
    Transport {
        /// One-line description, e.g. `cannot connect to http://127.0.0.1:7942: Connection refused`.
        message: String,
        /// The request timed out.
        timeout: bool,
        /// The connection could not be made (so the server never saw the request).
        connect: bool,
    },
    /// The server answered with the expected status but a body that does not decode.
    Decode(String),
    /// A request the client refuses to send (bad base URL, empty payload, …).
    Invalid(String),
}

impl Error {
    /// The HTTP status, for `Api` errors.
    pub fn status(&self) -> Option<u16> {
        match self {
            Error::Api(e) => Some(e.status),
            _ => None,
        }
    }

    /// The `HttpError`, if this is one.
    pub fn api(&self) -> Option<&HttpError> {
        match self {
            Error::Api(e) => Some(e),
            _ => None,
        }
    }

    /// The server's `Retry-After` in seconds, if any.
    pub fn retry_after(&self) -> Option<u64> {
        self.api().and_then(|e| e.retry_after)
    }

    /// Retryable: transport failures, `408`, `429`, `5xx`.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Api(e) => e.is_retryable(),
            Error::Transport { .. } => true,
            Error::Decode(_) | Error::Invalid(_) => false,
        }
    }

    /// A transport failure (no HTTP answer).
    pub fn is_transport(&self) -> bool {
        matches!(self, Error::Transport { .. })
    }

    pub(crate) fn from_reqwest(e: reqwest::Error, base: &str) -> Error {
        let timeout = e.is_timeout();
        let connect = e.is_connect();
        let message = if connect {
            format!("cannot connect to {base}: {}", innermost(&e))
        } else if timeout {
            match e.url() {
                Some(u) => format!("request to {} timed out", strip_query(u.as_str())),
                None => "request timed out".to_string(),
            }
        } else {
            chain(&e)
        };
        Error::Transport {
            message,
            timeout,
            connect,
        }
    }
}

fn strip_query(u: &str) -> &str {
    u.split('?').next().unwrap_or(u)
}

fn innermost(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let t = s.to_string();
        if !out.contains(&t) {
            out.push_str(": ");
            out.push_str(&t);
        }
        cur = s.source();
    }
    out
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Api(e) => e.fmt(f),
            Error::Transport { message, .. } => f.write_str(message),
            Error::Decode(m) => write!(f, "invalid answer from server: {m}"),
            Error::Invalid(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for Error {}

impl From<HttpError> for Error {
    fn from(e: HttpError) -> Self {
        Error::Api(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages() {
        let e = HttpError::from_body(404, br#"{"error":"topic \"x\" not found"}"#, None);
        assert_eq!(e.to_string(), "http 404: topic \"x\" not found");
        let e = HttpError::from_body(503, b"upstream down\n", Some("3"));
        assert_eq!(e.message, "upstream down");
        assert_eq!(e.retry_after, Some(3));
        assert!(e.is_retryable());
        let e = HttpError::from_body(503, br#"{"status":"shutting down"}"#, Some("soon"));
        assert_eq!(e.message, "shutting down");
        assert_eq!(e.retry_after, None);
        let e = HttpError::from_body(400, b"", None);
        assert_eq!(e.to_string(), "http 400");
        assert!(!e.is_retryable());
        let e = HttpError::from_body(400, br#"{"error":""}"#, None);
        assert_eq!(e.message, r#"{"error":""}"#);
        assert_eq!(Error::from(e).status(), Some(400));
    }
}
