//! The HTTP/1.1 server loop: keep-alive connections, `TCP_NODELAY`, optional TLS, the
//! configured timeouts, and graceful shutdown (stop accepting, let in-flight requests finish).
//!
//! Timeouts (SPEC §8, `http.*`):
//! - `read_timeout` bounds reading a request: its headers (hyper's header-read timeout, from
//!   the head's first byte: [`super::head_timeout`]) and its whole body (a deadline from
//!   the moment the headers are in; a body still arriving then fails the request with `408`
//!   and the connection closes). A body sent one byte a second cannot hold a connection
//!   open.
//! - `write_timeout` bounds each write: a client that stops reading its answer for that long
//!   loses the connection, and the answer's memory with it.
//! - `idle_timeout` bounds how long a connection may wait for its next request (and any read
//!   that makes no progress at all).
//! - With TLS, the TLS handshake must finish within `read_timeout`.
//!
//! The answers hyper writes by itself for request heads it refuses (`400`, `431`, `414`) get
//! the API's JSON error body on the way out ([`super::parse_errors`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::Router;
use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use super::head_timeout::{CountReads, HeadTimer, Reads};
use super::io_timeouts::TimeoutStream;
use super::parse_errors::{JsonParseErrors, PendingRequests, MAX_HEADERS};
use crate::tls::ReloadingTls;

/// The timeouts of the API listener.
#[derive(Debug, Clone, Copy)]
pub struct HttpTimeouts {
    pub read: Duration,
    pub write: Duration,
    pub idle: Duration,
}

/// The error a request body reports once its read deadline passed (`408` at the edge).
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within the read timeout of {0:?}")]
pub struct BodyReadTimeout(pub Duration);

pin_project_lite::pin_project! {
    /// A request body that fails with [`BodyReadTimeout`] once its deadline passed.
    struct DeadlineBody {
        #[pin]
        inner: Incoming,
        #[pin]
        deadline: tokio::time::Sleep,
        limit: Duration,
    }
}

impl HttpBody for DeadlineBody {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.project();
        if let Poll::Ready(frame) = this.inner.poll_frame(cx) {
            return Poll::Ready(frame.map(|r| r.map_err(Into::into)));
        }
        match this.deadline.poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(BodyReadTimeout(*this.limit))))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Serves `app` on `listener` (over TLS when `tls` is set) until `shutdown` is cancelled,
/// then waits for open connections to finish their current request (the caller bounds that
/// wait).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    timeouts: HttpTimeouts,
    tls: Option<Arc<ReloadingTls>>,
    shutdown: CancellationToken,
) {
    let graceful = GracefulShutdown::new();
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.cancelled() => break,
        };
        let _ = stream.set_nodelay(true);
        let stream = TimeoutStream::new(stream, Some(timeouts.idle), Some(timeouts.write));
        let app = app.clone();
        let watcher = graceful.watcher();
        let tls = tls
            .as_ref()
            .map(|t| tokio_rustls::TlsAcceptor::from(t.current().server));
        tokio::spawn(async move {
            let Some(acceptor) = tls else {
                return connection(stream, app, timeouts.read, watcher).await;
            };
            match tokio::time::timeout(timeouts.read, acceptor.accept(stream)).await {
                Ok(Ok(s)) => connection(s, app, timeouts.read, watcher).await,
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "tls handshake failed"),
                Err(_) => tracing::debug!(%peer, "no tls handshake in time"),
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// Serves one HTTP/1.1 connection over `io` to its end, each request body bounded by
/// `read_timeout`.
async fn connection<I>(
    io: I,
    app: Router,
    read_timeout: Duration,
    watcher: hyper_util::server::graceful::Watcher,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // Every request that reaches the service is counted before it can be answered, so that a
    // response head written with none waiting is recognised as hyper's own.
    let pending = Arc::new(PendingRequests::default());
    let arrivals = pending.clone();
    let svc = app.map_request(move |req: hyper::Request<Incoming>| {
        arrivals.arrived(req.method() == hyper::Method::HEAD);
        req.map(|inner| {
            Body::new(DeadlineBody {
                inner,
                deadline: tokio::time::sleep(read_timeout),
                limit: read_timeout,
            })
        })
    });
    // A head is timed from its first byte; the wait for it is the stream's idle wait.
    let reads = Reads::default();
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(HeadTimer::new(reads.clone()))
        .header_read_timeout(read_timeout)
        .keep_alive(true)
        .max_headers(MAX_HEADERS)
        .serve_connection(
            TokioIo::new(JsonParseErrors::new(CountReads::new(io, reads), pending)),
            TowerToHyperService::new(svc),
        );
    if let Err(e) = watcher.watch(conn).await {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}
