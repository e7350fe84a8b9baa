//! `ApiError`: what every layer returns to the HTTP edge, mapped 1:1 to SPEC §3.11.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

/// The words every uncertain answer carries ([`ApiError::uncertain`]; SPEC §3.11).
pub const UNCERTAIN: &str = "the outcome is unknown: the change may still be applied";

/// An error answer: HTTP status, message, optional `Retry-After` seconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub retry_after: Option<u64>,
    /// Answer with `Connection: close` (the request body was left unread).
    pub close: bool,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            retry_after: None,
            close: false,
        }
    }
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message)
    }
    pub fn topic_not_found(topic: &str) -> Self {
        Self::not_found(format!("topic {topic} not found"))
    }
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, message)
    }
    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(StatusCode::GONE, message)
    }
    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, message)
    }
    pub fn unavailable(message: impl Into<String>, retry_after: u64) -> Self {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: message.into(),
            retry_after: Some(retry_after),
            close: false,
        }
    }
    /// `429` with `Retry-After`: this node sheds the request under load; nothing was done
    /// (clients retry it as certain, CLIENT-COMPAT §4.1, §4.3).
    pub fn throttled(message: impl Into<String>, retry_after: u64) -> Self {
        ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            message: message.into(),
            retry_after: Some(retry_after),
            close: false,
        }
    }
    /// `502`: the operation may or may not have been applied (a forwarded request whose
    /// answer was lost, a metadata write not confirmed in time). The message ends with
    /// [`UNCERTAIN`], the text clients look for (CLIENT-COMPAT §4.3).
    pub fn uncertain(message: impl std::fmt::Display) -> Self {
        ApiError {
            status: StatusCode::BAD_GATEWAY,
            message: format!("{message}; {UNCERTAIN}"),
            retry_after: Some(1),
            close: false,
        }
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }
    /// The same error with another status.
    pub fn with_status(mut self, status: StatusCode) -> Self {
        self.status = status;
        self
    }
    pub fn method_not_allowed() -> Self {
        Self::new(StatusCode::METHOD_NOT_ALLOWED, "method not allowed")
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status.as_u16(), self.message)
    }
}

/// `{"error":"…"}` with `Content-Type: application/json`.
pub fn error_body(message: &str) -> String {
    serde_json::to_string(&narad_api::ErrorBody {
        error: message.to_string(),
    })
    .expect("invariant: a string always serialises")
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::error!(status = self.status.as_u16(), error = %self.message, "request failed");
        }
        let mut resp = (self.status, error_body(&self.message)).into_response();
        let headers = resp.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Some(secs) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if self.close {
            headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        resp
    }
}

impl From<narad_meta::MetaError> for ApiError {
    fn from(e: narad_meta::MetaError) -> Self {
        use narad_meta::{ApplyError, MetaError};
        match e {
            MetaError::Apply(ApplyError::NotFound(m)) => ApiError::not_found(m),
            MetaError::Apply(ApplyError::Conflict(m)) => ApiError::conflict(m),
            MetaError::Apply(ApplyError::Invalid(m)) => ApiError::bad_request(m),
            MetaError::Unavailable(m) => {
                ApiError::unavailable(format!("metadata unavailable: {m}"), 1)
            }
            MetaError::Uncertain(m) => {
                ApiError::uncertain(format!("metadata write not confirmed: {m}"))
            }
            MetaError::Storage(m) => ApiError::internal(format!("metadata storage error: {m}")),
        }
    }
}

pub type ApiResult<T> = Result<T, ApiError>;
