//! The HTTP API (SPEC §3): routing, request parsing and the error edge. It owns no state:
//! every handler works through the [`App`](crate::app::App) handles.
//!
//! Security (SPEC §4): [`authenticate`], a step of the [`edge`] middleware, runs on every
//! `/v1` request (probes and `/metrics` stay open). With security on it checks the Basic
//! credentials against the local metadata view (`security::Authenticator`: cache, throttle;
//! `401`/`429`); with security off it lets everything through as [`Caller::SecurityOff`]. It
//! leaves the [`Caller`] in the request extensions, where handlers take it as an extractor
//! and ask `security::authz` (`403`/`404`) before doing anything else.

mod children;
pub mod consume;
pub mod encoding;
mod head_timeout;
mod io_timeouts;
pub mod openapi;
pub mod parse_errors;
pub mod produce;
mod query;
mod queue;
pub mod server;
mod system;
mod topics;
mod users;

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{FromRef, FromRequestParts, MatchedPath, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use serde::de::DeserializeOwned;

use crate::app::App;
use crate::error::{error_body, ApiError, ApiResult, ErrorCode};
use crate::metrics::{HttpAnswer, HttpLabels};
use crate::security::Caller;

pub use query::Query;

/// Largest produce body and JSON request body (SPEC §11).
pub const MAX_BODY: usize = 1024 * 1024;

pub type AppState = Arc<App>;

/// The API router's state: the node's handles (what most handlers take, as [`AppState`]) and
/// what the produce routes read bodies with. A state rather than a request extension: a
/// layer that inserts one costs every request a map insert and another boxed service.
#[derive(Clone)]
pub struct ApiState {
    app: AppState,
    bodies: Arc<encoding::Bodies>,
}

impl FromRef<ApiState> for AppState {
    fn from_ref(s: &ApiState) -> AppState {
        s.app.clone()
    }
}

impl FromRef<ApiState> for Arc<encoding::Bodies> {
    fn from_ref(s: &ApiState) -> Arc<encoding::Bodies> {
        s.bodies.clone()
    }
}

/// Builds the router with every route of the API. With `http.metrics_addr` set, `/metrics`
/// is served by [`metrics_router`] on its own listener and answers `404` here. Compressed
/// produce bodies are decoded on `decoders`.
pub fn router(app: AppState, decoders: Arc<encoding::Decoders>) -> Router {
    // Every route comes with its operation in the OpenAPI document (`openapi::routes`).
    // `get` alone would also run consume for HEAD, leasing a message and dropping it.
    let routes = openapi::routes().split_for_parts().0.route(
        "/v1/topics/{topic}/consume",
        axum::routing::head(head_never_leases),
    );
    let routes = if app.config.http.metrics_addr.is_some() {
        routes.route("/metrics", axum::routing::any(metrics_elsewhere))
    } else {
        routes.route("/metrics", get(system::metrics))
    };
    let state = ApiState {
        bodies: Arc::new(encoding::Bodies {
            budget: encoding::BatchBudget::new(app.config.http.max_batch_bytes_in_flight),
            decoders,
        }),
        app: app.clone(),
    };
    crate::console::mount(routes, &app)
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(app, edge))
        .with_state(state)
}

/// Whether a route takes a produce body, which may come in `gzip` or `zstd` (SPEC §3.4).
fn takes_coded_body(path: Option<&MatchedPath>) -> bool {
    matches!(
        path.map(|p| p.as_str()),
        Some("/v1/topics/{topic}/produce" | "/v1/topics/{topic}/produce/batch")
    )
}

/// The answer refusing a request whose body comes in a coding the server does not decode,
/// before authentication or any handler reads it:
/// - `Transfer-Encoding` other than exactly `chunked` (RFC 9112 §6.1: a transfer coding the
///   server does not understand is `501`; `chunked` applied twice is `400`). hyper itself
///   answers `400` when the last coding is not `chunked`, since the body's length is then
///   unknown (RFC 9112 §6.3). The connection closes: the body is left unread.
/// - `Content-Encoding` this route does not decode: `415` with the `Accept-Encoding` it takes
///   (RFC 9110 §15.5.16). Produce and batch produce decode one of `gzip`, `zstd` (and
///   `identity`); every other route takes `identity` only.
fn refusal(req: &Request) -> Option<Response> {
    let coded = takes_coded_body(req.extensions().get::<MatchedPath>());
    let e = unsupported_coding(req.headers(), coded)?;
    let accept = e.code == ErrorCode::UnsupportedMediaType;
    let mut r = e.into_response();
    if accept {
        r.headers_mut().insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static(if coded {
                encoding::ACCEPTED
            } else {
                "identity"
            }),
        );
    }
    Some(r)
}

/// The codings of every `name` field, lower-cased, in order (`None` if one is not text).
fn codings(headers: &axum::http::HeaderMap, name: header::HeaderName) -> Option<Vec<String>> {
    let mut out = Vec::new();
    for v in headers.get_all(name).iter() {
        let text = v.to_str().ok()?;
        out.extend(
            text.split(',')
                .map(|c| c.trim().to_ascii_lowercase())
                .filter(|c| !c.is_empty()),
        );
    }
    Some(out)
}

/// The error for a request body in a coding this server does not decode (see
/// [`refusal`]).
fn unsupported_coding(headers: &axum::http::HeaderMap, coded: bool) -> Option<ApiError> {
    if headers.contains_key(header::TRANSFER_ENCODING) {
        let te = codings(headers, header::TRANSFER_ENCODING);
        let refused = match te.as_deref() {
            Some([only]) if only == "chunked" => None,
            Some(list) if !list.is_empty() && list.iter().all(|c| c == "chunked") => Some(
                ApiError::bad_request("Transfer-Encoding applies chunked more than once"),
            ),
            Some(list) => Some(ApiError::new(
                ErrorCode::NotImplemented,
                format!(
                    "Transfer-Encoding {:?} is not supported: send the body with Content-Length \
                     or with Transfer-Encoding: chunked alone",
                    list.join(", ")
                ),
            )),
            None => Some(ApiError::bad_request("Transfer-Encoding is not valid text")),
        };
        if let Some(e) = refused {
            return Some(e.closing());
        }
    }
    if coded {
        return encoding::request_coding(headers)
            .err()
            .map(|shown| unsupported_content_coding(&shown));
    }
    if headers.contains_key(header::CONTENT_ENCODING) {
        match codings(headers, header::CONTENT_ENCODING) {
            Some(list) if list.iter().all(|c| c == "identity") => {}
            list => {
                let shown = list.map_or_else(|| "?".to_string(), |l| l.join(", "));
                return Some(ApiError::new(
                    ErrorCode::UnsupportedMediaType,
                    format!(
                        "Content-Encoding {shown:?} is not supported: send the body \
                         uncompressed (identity)"
                    ),
                ));
            }
        }
    }
    None
}

/// `415` for a produce body in a coding (or a stack of codings) this server does not decode.
fn unsupported_content_coding(shown: &str) -> ApiError {
    ApiError::new(
        ErrorCode::UnsupportedMediaType,
        format!(
            "Content-Encoding {shown:?} is not supported: send the body uncompressed \
             (identity) or in one of gzip, zstd"
        ),
    )
}

/// The router of the metrics listener (`http.metrics_addr`, plain HTTP, no credentials):
/// `GET /metrics` only; anything else is `404`/`405` with the JSON error body.
pub fn metrics_router(app: AppState) -> Router {
    Router::new()
        .route("/metrics", get(system::metrics))
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(
            app.clone(),
            metrics_edge,
        ))
        .with_state(app)
}

/// `/metrics` on the API listener when the metrics have a listener of their own.
async fn metrics_elsewhere() -> ApiError {
    ApiError::not_found(
        "route not found: /metrics is served on the metrics listener (http.metrics_addr)",
    )
}

/// `HEAD …/consume`: `405` (`Allow: GET`). A HEAD must not change anything, and a consume
/// leases.
async fn head_never_leases() -> Response {
    let mut r = ApiError::method_not_allowed().into_response();
    r.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static("GET"));
    r
}

/// Whether `path` is an API route that needs credentials (everything under `/v1` but the
/// OpenAPI document).
fn needs_auth(path: &str) -> bool {
    (path == "/v1" || path.starts_with("/v1/")) && path != openapi::PATH
}

/// Authenticates a `/v1` request (SPEC §4.1) and leaves the [`Caller`] for the handler.
/// With security on: no, malformed or wrong credentials → `401` with
/// `WWW-Authenticate: Basic realm="narad"`; throttled → `429` with `Retry-After`. A keep-alive
/// client with a verified password pays one HMAC and a map lookup, no argon2.
async fn authenticate(app: &App, req: &mut Request) -> Result<(), Response> {
    if !needs_auth(req.uri().path()) {
        return Ok(());
    }
    let caller = app
        .caller_of(req.headers())
        .await
        .map_err(IntoResponse::into_response)?;
    req.extensions_mut().insert(caller);
    Ok(())
}

/// Handlers take the [`Caller`] [`authenticate`] left in the request.
impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _state: &S,
    ) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .remove::<Caller>()
            .ok_or_else(|| ApiError::internal("request reached a handler without authentication"))
    }
}

async fn not_found() -> ApiError {
    ApiError::not_found("route not found")
}

/// The `route` label of a request: its route's template (as the OpenAPI document lists it),
/// `/ui` for the console, or `unmatched`.
fn route_label(path: Option<&MatchedPath>) -> &'static str {
    let routes = &openapi::model().paths.paths;
    match path.map(MatchedPath::as_str) {
        Some(p) if p.starts_with("/ui") => "/ui",
        Some(p) => routes
            .get_key_value(p)
            .map_or("unmatched", |(k, _)| k.as_str()),
        None => "unmatched",
    }
}

fn method_label(m: &Method) -> &'static str {
    match *m {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        _ => "OTHER",
    }
}

/// The one middleware every API request passes through, in this order: metrics for every
/// request (refusals included), the [`refusal`] of a body coding this route does not decode,
/// [`authenticate`], the route; on the way out `Connection: close` while the node stops, and
/// the JSON error body for the router's own 405s. One layer rather than one per step: each
/// layer costs a request a boxed service clone and a boxed future.
async fn edge(State(app): State<AppState>, req: Request, next: Next) -> Response {
    through_edge(app, req, next, true).await
}

/// [`edge`] for the metrics listener, which takes no credentials.
async fn metrics_edge(State(app): State<AppState>, req: Request, next: Next) -> Response {
    through_edge(app, req, next, false).await
}

async fn through_edge(
    app: AppState,
    mut req: Request,
    next: Next,
    authenticated: bool,
) -> Response {
    let started = Instant::now();
    let route = route_label(req.extensions().get::<MatchedPath>());
    let method = method_label(req.method());
    let bytes_in = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    let m = &app.metrics;
    m.http_in_flight.inc();
    let admitted = match refusal(&req) {
        Some(refused) => Err(refused),
        None if authenticated => authenticate(&app, &mut req).await,
        None => Ok(()),
    };
    let mut resp = match admitted {
        Ok(()) => next.run(req).await,
        Err(r) => r,
    };
    m.http_in_flight.dec();
    if app.health.is_stopping() {
        // Shutting down (SIGTERM, `http.shutdown_delay`): keep-alive clients reconnect for
        // their next request, so it goes where a Service now routes, not to this node.
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    if resp.status() == StatusCode::METHOD_NOT_ALLOWED
        && resp.headers().get(header::CONTENT_TYPE).is_none()
    {
        let allow = resp.headers().get(header::ALLOW).cloned();
        resp = ApiError::method_not_allowed().into_response();
        if let Some(a) = allow {
            resp.headers_mut().insert(header::ALLOW, a);
        }
    }
    m.http_answered(
        HttpLabels {
            route,
            method,
            status: resp.status().as_u16(),
        },
        HttpAnswer {
            seconds: started.elapsed().as_secs_f64(),
            bytes_in,
            bytes_out: axum::body::HttpBody::size_hint(resp.body()).exact(),
        },
    );
    resp
}

/// Most bytes of an oversized body read and discarded so that the connection stays usable;
/// beyond this the `413` closes the connection.
const MAX_DRAIN: u64 = 16 * 1024 * 1024;

/// Reads a request body of at most `MAX_BODY` bytes (`413` beyond).
pub async fn read_body(headers: &axum::http::HeaderMap, body: Body) -> ApiResult<Bytes> {
    read_raw(headers, body, MAX_BODY, MAX_DRAIN, None).await
}

/// `429`: the node's budget of batch bytes in flight is spent (nothing was stored).
fn batch_budget_spent(close: bool) -> ApiError {
    ApiError {
        close,
        ..ApiError::throttled(
            "too many batch produce bytes in flight on this node \
             (http.max_batch_bytes_in_flight); nothing was stored, retry shortly",
            1,
        )
    }
}

/// The error of a body chunk that could not be read.
fn body_read_error(e: axum::Error) -> ApiError {
    let inner = e.into_inner();
    match inner.downcast_ref::<server::BodyReadTimeout>() {
        // The rest of the body is not coming in time: answer and close.
        Some(t) => ApiError::new(ErrorCode::RequestTimeout, t.to_string()).closing(),
        None => ApiError::bad_request(format!("could not read the request body: {inner}")),
    }
}

/// Reads a request body of at most `limit` bytes as sent (`413` beyond; up to `drain`
/// bytes of an oversized body are read and discarded so the connection stays usable).
/// With a budget `guard`, the body's bytes are taken from it first: from `Content-Length`
/// before any byte is buffered, else as they arrive; a refusal is `429` with nothing kept.
async fn read_raw(
    headers: &axum::http::HeaderMap,
    body: Body,
    limit: usize,
    drain: u64,
    mut guard: Option<&mut encoding::BudgetGuard>,
) -> ApiResult<Bytes> {
    use futures::StreamExt;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let too_large = |close: bool| ApiError {
        close,
        ..ApiError::too_large(format!("request body exceeds the limit of {limit} bytes"))
    };
    if declared.is_some_and(|len| len > drain) {
        return Err(too_large(true));
    }
    let mut stream = body.into_data_stream();
    if let (Some(g), Some(len)) = (guard.as_deref_mut(), declared) {
        if len <= limit as u64 && !g.grow(len) {
            // Read and drop the body (at most `drain` bytes) so the client gets the answer.
            while let Some(chunk) = stream.next().await {
                chunk.map_err(body_read_error)?;
            }
            return Err(batch_budget_spent(false));
        }
    }
    let counted_upfront = declared.is_some();
    let mut buf = bytes::BytesMut::with_capacity(declared.unwrap_or(0).min(limit as u64) as usize);
    let mut total: u64 = 0;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(body_read_error)?;
        total += chunk.len() as u64;
        if total > drain {
            return Err(too_large(true));
        }
        if total <= limit as u64 {
            if !counted_upfront {
                if let Some(g) = guard.as_deref_mut() {
                    if !g.grow(chunk.len() as u64) {
                        return Err(batch_budget_spent(true));
                    }
                }
            }
            buf.extend_from_slice(&chunk);
        }
    }
    if total > limit as u64 {
        // Read to the end: the connection can carry the next request.
        return Err(too_large(false));
    }
    Ok(buf.freeze())
}

/// Room for a compressed body beyond its decoded limit (incompressible data grows a little).
fn coded_slack(limit: usize) -> usize {
    limit / 128 + 4096
}

/// Reads a produce body in its `Content-Encoding` (`identity`, `gzip`, `zstd`): at most
/// `limit` bytes decoded (`413`), the compressed body itself bounded before decoding; a
/// corrupt stream is `400`. With a budget `guard`, the bytes received and the bytes decoded
/// are both taken from it (`429` when spent).
pub async fn read_coded(
    headers: &axum::http::HeaderMap,
    body: Body,
    limit: usize,
    drain: u64,
    decoders: &encoding::Decoders,
    mut guard: Option<encoding::BudgetGuard>,
) -> ApiResult<(Bytes, Option<encoding::BudgetGuard>)> {
    use encoding::{Coding, DecodeError};
    let coding = encoding::request_coding(headers).map_err(|s| unsupported_content_coding(&s))?;
    if coding == Coding::Identity {
        let raw = read_raw(headers, body, limit, drain, guard.as_mut()).await?;
        return Ok((raw, guard));
    }
    let raw = read_raw(
        headers,
        body,
        limit + coded_slack(limit),
        drain.max((limit + coded_slack(limit)) as u64),
        guard.as_mut(),
    )
    .await?;
    let decoded = decoders.decode(coding, raw, limit, guard).await;
    match decoded {
        (Ok(out), guard) => Ok((Bytes::from(out), guard)),
        (Err(DecodeError::TooLarge), _) => Err(ApiError::too_large(format!(
            "request body exceeds the limit of {limit} bytes once decoded (Content-Encoding \
             {})",
            coding.name()
        ))),
        (Err(DecodeError::Budget), _) => Err(batch_budget_spent(false)),
        (Err(DecodeError::Corrupt(why)), _) => Err(ApiError::bad_request(format!(
            "request body is not a valid {} stream (Content-Encoding): {why}",
            coding.name()
        ))),
    }
}

/// Parses a strict JSON body: unknown fields, trailing data and a second value are `400`.
pub fn parse_json<T: DeserializeOwned>(body: &[u8]) -> ApiResult<T> {
    if body.is_empty() {
        return Err(ApiError::bad_request("request body must be a JSON object"));
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))
}

/// Reads a strict JSON request body (`413` over `MAX_BODY`, `400` if malformed).
pub async fn read_json<T: DeserializeOwned>(
    headers: &axum::http::HeaderMap,
    body: Body,
) -> ApiResult<T> {
    parse_json(&read_body(headers, body).await?)
}

/// A `200`/`201` JSON answer from pre-encoded bytes.
pub fn json_response(status: StatusCode, body: Vec<u8>) -> Response {
    let mut resp = (status, body).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// A JSON answer from a serialisable value.
pub fn json<T: serde::Serialize>(status: StatusCode, value: &T) -> Response {
    match serde_json::to_vec(value) {
        Ok(b) => json_response(status, b),
        Err(e) => ApiError::internal(format!("could not encode the answer: {e}")).into_response(),
    }
}

/// The topic a caller manages (alter, pause, purge, seek): the `manage` permission (`403`,
/// whether or not it exists), then existence (`404`).
pub async fn managed_topic(
    app: &App,
    caller: &Caller,
    name: &str,
) -> ApiResult<Arc<narad_meta::Topic>> {
    let topic = find_topic(app, name).await;
    crate::security::authz::manage(caller, name, topic.as_deref())?;
    topic.ok_or_else(|| ApiError::topic_not_found(name))
}

/// The topic `name` in the node's current metadata view (`None` = missing), for the
/// `security::authz` decisions that weigh existence and permission together.
/// Looks a topic up in the local replica; in a cluster, a name this replica does not know
/// is first checked with the leader (it may have been created through another node a moment
/// ago: SPEC §6.1), so a `404` is never the answer of a replica that was merely behind.
pub async fn find_topic(app: &App, name: &str) -> Option<Arc<narad_meta::Topic>> {
    if let Some(t) = app.meta.view().topics.get(name) {
        return Some(t.clone());
    }
    if !app.cluster.clustered {
        return None;
    }
    match app.cluster.read_current(Some(name)).await {
        Ok(t) => t,
        Err(e) => {
            tracing::debug!(topic = name, error = %e.message, "catch-up read failed");
            None
        }
    }
}

/// The one `{name}` segment of a route (a topic or a username), percent-decoded; a bad
/// segment answers `400` with the one error body.
pub struct Name(pub String);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Name {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        match axum::extract::Path::<String>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(name)) => Ok(Name(name)),
            Err(e) => Err(ApiError::bad_request(format!("invalid path: {e}"))),
        }
    }
}

/// The body of a plain `{"error":…}` answer (for the few places that build responses by hand).
pub fn error_json(message: &str) -> String {
    error_body(message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderMap;

    fn with(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    fn status(pairs: &[(&str, &str)]) -> Option<u16> {
        unsupported_coding(&with(pairs), false).map(|e| e.status().as_u16())
    }

    #[test]
    fn only_plain_chunked_and_identity_bodies_are_read() {
        assert_eq!(status(&[]), None);
        assert_eq!(status(&[("transfer-encoding", "chunked")]), None);
        assert_eq!(status(&[("transfer-encoding", " Chunked ")]), None);
        assert_eq!(status(&[("content-encoding", "identity")]), None);
        assert_eq!(status(&[("transfer-encoding", "gzip, chunked")]), Some(501));
        assert_eq!(
            status(&[
                ("transfer-encoding", "gzip"),
                ("transfer-encoding", "chunked")
            ]),
            Some(501)
        );
        assert_eq!(
            status(&[("transfer-encoding", "chunked, chunked")]),
            Some(400)
        );
        assert_eq!(status(&[("transfer-encoding", "")]), Some(501));
        assert_eq!(status(&[("content-encoding", "gzip")]), Some(415));
        assert_eq!(status(&[("content-encoding", "identity, br")]), Some(415));
        let coded = |pairs: &[(&str, &str)]| {
            unsupported_coding(&with(pairs), true).map(|e| e.status().as_u16())
        };
        assert_eq!(coded(&[("content-encoding", "gzip")]), None);
        assert_eq!(coded(&[("content-encoding", "zstd")]), None);
        assert_eq!(coded(&[("content-encoding", "identity")]), None);
        assert_eq!(coded(&[("content-encoding", "br")]), Some(415));
        assert_eq!(coded(&[("content-encoding", "gzip, zstd")]), Some(415));
        assert_eq!(coded(&[("transfer-encoding", "gzip, chunked")]), Some(501));
        let e =
            unsupported_coding(&with(&[("transfer-encoding", "gzip, chunked")]), false).unwrap();
        assert!(e.close, "the body is left unread: the connection closes");
    }
}
