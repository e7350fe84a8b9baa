//! `ApiError`, the one error edge: a stable [`ErrorCode`] plus a human message, mapped to HTTP
//! status, headers and body in one place ([`ErrorCode::status`], `IntoResponse`) and carried
//! over node RPC in the same `{"error": …}` body with a `"code"` beside it
//! ([`ApiError::to_reply`], [`ApiError::from_reply`], defined beside the frames in `rpc::proto`).
//!
//! Decisions are taken on codes, never on message text: the message is for people and may be
//! reworded in any release; the code is part of the node-RPC contract.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

/// The words every uncertain answer carries ([`ApiError::uncertain`]; SPEC §3.11).
pub const UNCERTAIN: &str = "the outcome is unknown: the change may still be applied";

/// Why a request failed, as a number that stays the same across releases.
///
/// Numbers are append-only (as iggy's and nats-server's error tables): a code is never
/// renumbered, and one that goes out of use is listed in [`RETIRED_CODES`] and never given to
/// another meaning. A peer that reads a number it does not know falls back to the reply's HTTP
/// status ([`ErrorCode::for_status`]), so a new code never breaks an older node.
#[repr(u16)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// A fault of this node (storage, an invariant, an unreadable reply); `500`.
    Internal = 1,
    /// The request is malformed or out of range; `400`.
    BadRequest = 2,
    /// No or wrong credentials; `401` with `WWW-Authenticate`.
    Unauthenticated = 3,
    /// Authenticated, not allowed; `403`.
    Forbidden = 4,
    /// No such route, user, link, move, …; `404`.
    NotFound = 5,
    /// No such topic; `404`.
    TopicNotFound = 6,
    /// `405`.
    MethodNotAllowed = 7,
    /// The request body did not arrive in time; `408`.
    RequestTimeout = 8,
    /// The request contradicts the current state (exists already, not empty, …); `409`.
    Conflict = 9,
    /// A receipt handle whose lease is over, or a thing that is gone for good; `410`.
    Gone = 10,
    /// `413`.
    PayloadTooLarge = 11,
    /// A body in a coding this server does not decode; `415`.
    UnsupportedMediaType = 12,
    /// Shed under load or throttled; nothing was done, retry after `Retry-After`; `429`.
    Throttled = 13,
    /// `501`.
    NotImplemented = 14,
    /// The operation may or may not have been applied (an answer lost in forwarding, a
    /// metadata write not confirmed in time); `502` with [`UNCERTAIN`].
    MaybeApplied = 15,
    /// Nothing was applied and a retry may succeed; `503` with `Retry-After`.
    Unavailable = 16,
    /// This node is not the metadata leader (the message names the leader when known); `503`.
    NotLeader = 17,
    /// This node is the metadata leader and is handing leadership off; `503`.
    LeaderHandingOff = 18,
    /// A partition refuses commits (frozen for a move, moved away): the sender retries and
    /// reroutes; `503`.
    CommitRefused = 19,
    /// The partition is not owned by the node asked; `409`.
    NotOwner = 20,
    /// A node-RPC opcode the serving node does not know (it runs an older build); `400`.
    RpcUnsupported = 21,
    /// The node is still starting; `503`.
    Starting = 22,
}

/// Codes no longer in use. Their numbers are never given to another meaning.
pub const RETIRED_CODES: &[u16] = &[];

/// Every code in use, in number order (the table the tests check for gaps and reuse).
pub const ALL_CODES: &[ErrorCode] = &[
    ErrorCode::Internal,
    ErrorCode::BadRequest,
    ErrorCode::Unauthenticated,
    ErrorCode::Forbidden,
    ErrorCode::NotFound,
    ErrorCode::TopicNotFound,
    ErrorCode::MethodNotAllowed,
    ErrorCode::RequestTimeout,
    ErrorCode::Conflict,
    ErrorCode::Gone,
    ErrorCode::PayloadTooLarge,
    ErrorCode::UnsupportedMediaType,
    ErrorCode::Throttled,
    ErrorCode::NotImplemented,
    ErrorCode::MaybeApplied,
    ErrorCode::Unavailable,
    ErrorCode::NotLeader,
    ErrorCode::LeaderHandingOff,
    ErrorCode::CommitRefused,
    ErrorCode::NotOwner,
    ErrorCode::RpcUnsupported,
    ErrorCode::Starting,
];

impl ErrorCode {
    /// The code's number on the wire.
    pub fn number(self) -> u16 {
        self as u16
    }

    /// The code with this number, if this build knows it.
    pub fn from_number(n: u16) -> Option<ErrorCode> {
        ALL_CODES.iter().copied().find(|c| c.number() == n)
    }

    /// The HTTP status of the code: the one mapping (SPEC §3.11).
    pub fn status(self) -> StatusCode {
        use ErrorCode::*;
        match self {
            Internal => StatusCode::INTERNAL_SERVER_ERROR,
            BadRequest | RpcUnsupported => StatusCode::BAD_REQUEST,
            Unauthenticated => StatusCode::UNAUTHORIZED,
            Forbidden => StatusCode::FORBIDDEN,
            NotFound | TopicNotFound => StatusCode::NOT_FOUND,
            MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            Conflict | NotOwner => StatusCode::CONFLICT,
            Gone => StatusCode::GONE,
            PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Throttled => StatusCode::TOO_MANY_REQUESTS,
            NotImplemented => StatusCode::NOT_IMPLEMENTED,
            MaybeApplied => StatusCode::BAD_GATEWAY,
            Unavailable | NotLeader | LeaderHandingOff | CommitRefused | Starting => {
                StatusCode::SERVICE_UNAVAILABLE
            }
        }
    }

    /// The generic code of an HTTP status: how a reply without a known code (an older peer,
    /// a newer code) is read.
    pub fn for_status(status: u16) -> ErrorCode {
        use ErrorCode::*;
        match status {
            401 => Unauthenticated,
            403 => Forbidden,
            404 => NotFound,
            405 => MethodNotAllowed,
            408 => RequestTimeout,
            409 => Conflict,
            410 => Gone,
            413 => PayloadTooLarge,
            415 => UnsupportedMediaType,
            429 => Throttled,
            501 => NotImplemented,
            502 => MaybeApplied,
            503 => Unavailable,
            400..=499 => BadRequest,
            _ => Internal,
        }
    }

    /// `Retry-After` seconds answered with the code unless the error says otherwise: `1` for
    /// the codes a client retries (`429`, `502`, `503`), none for the rest.
    fn default_retry_after(self) -> Option<u64> {
        matches!(
            self.status(),
            StatusCode::TOO_MANY_REQUESTS
                | StatusCode::BAD_GATEWAY
                | StatusCode::SERVICE_UNAVAILABLE
        )
        .then_some(1)
    }
}

/// An error answer: code, message, optional `Retry-After` seconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
    pub retry_after: Option<u64>,
    /// Answer with `Connection: close` (the request body was left unread).
    pub close: bool,
}

/// The `WWW-Authenticate` value sent with every `401` (SPEC §3.11).
pub const WWW_AUTHENTICATE: &str = "Basic realm=\"narad\"";

impl ApiError {
    /// An error with `code` and the code's default `Retry-After`.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError {
            code,
            message: message.into(),
            retry_after: code.default_retry_after(),
            close: false,
        }
    }
    /// The HTTP status the error is answered with.
    pub fn status(&self) -> StatusCode {
        self.code.status()
    }
    /// Whether nothing was done and a retry (here later, or elsewhere) may succeed: every
    /// code answered `503` (unavailable, not the leader, handing off, commit refused,
    /// starting).
    pub fn is_unavailable(&self) -> bool {
        self.status() == StatusCode::SERVICE_UNAVAILABLE
    }
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::BadRequest, message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::NotFound, message)
    }
    pub fn topic_not_found(topic: &str) -> Self {
        Self::new(ErrorCode::TopicNotFound, format!("topic {topic} not found"))
    }
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Conflict, message)
    }
    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Gone, message)
    }
    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::PayloadTooLarge, message)
    }
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Forbidden, message)
    }
    pub fn unavailable(message: impl Into<String>, retry_after: u64) -> Self {
        ApiError {
            retry_after: Some(retry_after),
            ..Self::new(ErrorCode::Unavailable, message)
        }
    }
    /// `429` with `Retry-After`: this node sheds the request under load; nothing was done
    /// (clients retry it as certain, CLIENT-COMPAT §4.1, §4.3).
    pub fn throttled(message: impl Into<String>, retry_after: u64) -> Self {
        ApiError {
            retry_after: Some(retry_after),
            ..Self::new(ErrorCode::Throttled, message)
        }
    }
    /// `502`: the operation may or may not have been applied (a forwarded request whose
    /// answer was lost, a metadata write not confirmed in time). The message ends with
    /// [`UNCERTAIN`], the text clients look for (CLIENT-COMPAT §4.3).
    pub fn uncertain(message: impl std::fmt::Display) -> Self {
        Self::new(ErrorCode::MaybeApplied, format!("{message}; {UNCERTAIN}"))
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Internal, message)
    }
    pub fn method_not_allowed() -> Self {
        Self::new(ErrorCode::MethodNotAllowed, "method not allowed")
    }
    /// The same error, answered with `Connection: close`.
    pub fn closing(self) -> Self {
        ApiError {
            close: true,
            ..self
        }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status().as_u16(), self.message)
    }
}

/// `{"error":"…"}` with `Content-Type: application/json`.
pub fn error_body(message: &str) -> String {
    serde_json::to_string(&narad_api::ErrorBody {
        error: message.to_string(),
    })
    .expect("invariant: a string always serialises")
}

/// The one mapping of an error to an HTTP answer: status from the code, `{"error": …}` body,
/// `Retry-After`, `WWW-Authenticate` for `401`, `Connection: close` when the body was left
/// unread.
impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() {
            tracing::error!(
                status = status.as_u16(),
                code = self.code.number(),
                error = %self.message,
                "request failed"
            );
        }
        let mut resp = (status, error_body(&self.message)).into_response();
        let headers = resp.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Some(secs) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if self.code == ErrorCode::Unauthenticated {
            headers.insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static(WWW_AUTHENTICATE),
            );
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
            // A count the user can lower (delete a topic), not a rate to wait out: no retry.
            MetaError::Apply(ApplyError::QuotaExceeded(m)) => ApiError::conflict(m),
            e @ MetaError::NotLeader { .. } => ApiError::new(ErrorCode::NotLeader, e.to_string()),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rpc::RpcReply;

    /// The numbers are part of the node-RPC contract: pinned here, so renumbering fails.
    #[test]
    fn codes_keep_their_numbers_and_none_is_reused() {
        let pinned: &[(ErrorCode, u16)] = &[
            (ErrorCode::Internal, 1),
            (ErrorCode::BadRequest, 2),
            (ErrorCode::Unauthenticated, 3),
            (ErrorCode::Forbidden, 4),
            (ErrorCode::NotFound, 5),
            (ErrorCode::TopicNotFound, 6),
            (ErrorCode::MethodNotAllowed, 7),
            (ErrorCode::RequestTimeout, 8),
            (ErrorCode::Conflict, 9),
            (ErrorCode::Gone, 10),
            (ErrorCode::PayloadTooLarge, 11),
            (ErrorCode::UnsupportedMediaType, 12),
            (ErrorCode::Throttled, 13),
            (ErrorCode::NotImplemented, 14),
            (ErrorCode::MaybeApplied, 15),
            (ErrorCode::Unavailable, 16),
            (ErrorCode::NotLeader, 17),
            (ErrorCode::LeaderHandingOff, 18),
            (ErrorCode::CommitRefused, 19),
            (ErrorCode::NotOwner, 20),
            (ErrorCode::RpcUnsupported, 21),
            (ErrorCode::Starting, 22),
        ];
        assert_eq!(
            pinned.len(),
            ALL_CODES.len(),
            "a code without a pinned number"
        );
        for (code, n) in pinned {
            assert_eq!(code.number(), *n, "{code:?} was renumbered");
            assert_eq!(ErrorCode::from_number(*n), Some(*code));
            assert!(
                !RETIRED_CODES.contains(n),
                "{code:?} reuses a retired number"
            );
        }
        let mut numbers: Vec<u16> = ALL_CODES.iter().map(|c| c.number()).collect();
        numbers.sort();
        numbers.dedup();
        assert_eq!(numbers.len(), ALL_CODES.len(), "two codes share a number");
        assert_eq!(ErrorCode::from_number(0), None);
        assert_eq!(ErrorCode::from_number(u16::MAX), None);
    }

    #[test]
    fn every_code_is_an_error_status_that_reads_back_to_a_code_of_that_status() {
        for &code in ALL_CODES {
            let s = code.status();
            assert!(s.is_client_error() || s.is_server_error(), "{code:?}");
            assert_eq!(ErrorCode::for_status(s.as_u16()).status(), s, "{code:?}");
        }
        assert_eq!(ErrorCode::for_status(418), ErrorCode::BadRequest);
        assert_eq!(ErrorCode::for_status(504), ErrorCode::Internal);
    }

    #[test]
    fn an_error_travels_over_rpc_with_its_code_and_message() {
        for &code in ALL_CODES {
            let e = ApiError::new(code, format!("because {code:?}"));
            let reply = e.to_reply();
            assert_eq!(reply.status, code.status().as_u16());
            let back = ApiError::from_reply(&reply);
            assert_eq!((back.code, &back.message[..]), (code, &e.message[..]));
            assert_eq!(back.retry_after, e.retry_after);
        }
    }

    #[test]
    fn replies_of_older_builds_and_unknown_codes_are_read_by_status() {
        // A build before codes: the same body without "code".
        let old = RpcReply::new(503, crate::rpc::proto::JSON, &br#"{"error":"busy"}"#[..]);
        let e = ApiError::from_reply(&old);
        assert_eq!(
            (e.code, &e.message[..], e.retry_after),
            (ErrorCode::Unavailable, "busy", Some(1))
        );
        // A newer build's code this one does not know.
        let newer = RpcReply::new(
            409,
            crate::rpc::proto::JSON,
            &br#"{"error":"x","code":60000}"#[..],
        );
        assert_eq!(ApiError::from_reply(&newer).code, ErrorCode::Conflict);
        // Not JSON at all.
        let raw = RpcReply::new(500, "text/plain", &b"boom"[..]);
        let e = ApiError::from_reply(&raw);
        assert_eq!((e.code, &e.message[..]), (ErrorCode::Internal, "boom"));
    }

    #[test]
    fn the_http_answer_carries_status_body_and_headers_from_the_code() {
        let resp = ApiError::new(ErrorCode::Unauthenticated, "who are you").into_response();
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
        assert!(resp.headers().contains_key(header::WWW_AUTHENTICATE));
        assert!(!resp.headers().contains_key(header::RETRY_AFTER));
        let resp = ApiError::new(ErrorCode::NotLeader, "elsewhere")
            .closing()
            .into_response();
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(resp.headers()[header::RETRY_AFTER], "1");
        assert_eq!(resp.headers()[header::CONNECTION], "close");
        assert!(!resp.headers().contains_key(header::WWW_AUTHENTICATE));
    }
}
