//! `http.read_timeout` for a request's head, counted from the head's first byte.
//!
//! hyper starts its header read timeout as soon as it waits for the next request on a
//! kept-alive connection, so an idle connection was closed after `read_timeout` (10 s)
//! instead of `idle_timeout` (60 s). A client that reused it then (Go's transport keeps idle
//! connections 90 s) could find it closed under a request it had sent, which for a produce is
//! an error it cannot safely retry. Here hyper's timer hands out sleeps that start counting
//! only once the connection has read a byte since hyper began waiting for the head; until
//! then the wait is the connection's idle wait, bounded by `idle_timeout` on its stream
//! ([`super::io_timeouts`]). The first request of a connection is timed from the start, as
//! Go's server times it, so that a connection that never sends costs `read_timeout` at most.
//!
//! A head that arrives in one read, the usual case, never arms a timer at all.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// How many reads of a connection returned bytes, shared by its stream and its timer.
#[derive(Debug, Clone, Default)]
pub struct Reads(Arc<AtomicU64>);

impl Reads {
    fn now(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// hyper's timer for one connection: its sleeps wait for a byte of the head (see the module).
#[derive(Debug, Clone)]
pub struct HeadTimer {
    reads: Reads,
}

impl HeadTimer {
    pub fn new(reads: Reads) -> HeadTimer {
        HeadTimer { reads }
    }
}

impl hyper::rt::Timer for HeadTimer {
    fn sleep(&self, limit: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        let seen = self.reads.now();
        Box::pin(HeadSleep {
            limit,
            reads: self.reads.clone(),
            // Nothing read yet: the connection's first head, timed from now.
            seen: (seen > 0).then_some(seen),
            armed: None,
        })
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        self.sleep(deadline.saturating_duration_since(Instant::now()))
    }
}

/// A sleep of `limit` that starts once a read has returned bytes after `seen` reads.
struct HeadSleep {
    limit: Duration,
    reads: Reads,
    /// The reads when the sleep was made; `None`: it counts from the start.
    seen: Option<u64>,
    armed: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Future for HeadSleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        if this.armed.is_none() {
            if this.seen == Some(this.reads.now()) {
                // No byte of the head yet. hyper polls this only after its read of the
                // stream was pending, so the next byte wakes the connection's task anyway.
                return Poll::Pending;
            }
            this.armed = Some(Box::pin(tokio::time::sleep(this.limit)));
        }
        this.armed.as_mut().expect("armed above").as_mut().poll(cx)
    }
}

impl hyper::rt::Sleep for HeadSleep {}

/// A stream that counts its reads that returned bytes into [`Reads`].
pub struct CountReads<S> {
    inner: S,
    reads: Reads,
}

impl<S> CountReads<S> {
    pub fn new(inner: S, reads: Reads) -> Self {
        CountReads { inner, reads }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for CountReads<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.reads.0.fetch_add(1, Ordering::Relaxed);
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for CountReads<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::rt::Timer;
    use tokio::io::AsyncReadExt;

    const LIMIT: Duration = Duration::from_secs(10);

    fn poll(sleep: &mut Pin<Box<dyn hyper::rt::Sleep>>) -> Poll<()> {
        let mut cx = Context::from_waker(futures::task::noop_waker_ref());
        sleep.as_mut().poll(&mut cx)
    }

    /// Lets the paused clock run `d` (the timer wheel fires what is due).
    async fn pass(d: Duration) {
        tokio::time::advance(d).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_s_first_head_is_timed_from_the_start() {
        let timer = HeadTimer::new(Reads::default());
        let mut sleep = timer.sleep(LIMIT);
        assert!(poll(&mut sleep).is_pending());
        pass(LIMIT).await;
        assert!(poll(&mut sleep).is_ready());
    }

    #[tokio::test(start_paused = true)]
    async fn a_later_head_is_timed_from_its_first_byte_not_from_the_wait() {
        let (mut client, server) = tokio::io::duplex(64);
        let reads = Reads::default();
        let mut stream = CountReads::new(server, reads.clone());
        let timer = HeadTimer::new(reads.clone());
        // The first request was read.
        tokio::io::AsyncWriteExt::write_all(&mut client, b"GET / HTTP/1.1\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 64];
        assert!(stream.read(&mut buf).await.unwrap() > 0);
        assert_eq!(reads.now(), 1);
        // Waiting for the next one: idle, however long.
        let mut sleep = timer.sleep_until(Instant::now() + LIMIT);
        assert!(poll(&mut sleep).is_pending());
        pass(LIMIT * 10).await;
        assert!(poll(&mut sleep).is_pending(), "an idle wait was timed");
        // Its first byte starts the clock.
        tokio::io::AsyncWriteExt::write_all(&mut client, b"G")
            .await
            .unwrap();
        assert_eq!(stream.read(&mut buf).await.unwrap(), 1);
        assert!(poll(&mut sleep).is_pending());
        pass(LIMIT - Duration::from_millis(1)).await;
        assert!(poll(&mut sleep).is_pending());
        pass(Duration::from_millis(1)).await;
        assert!(poll(&mut sleep).is_ready());
    }

    #[tokio::test]
    async fn only_reads_that_return_bytes_count() {
        let (client, server) = tokio::io::duplex(64);
        let reads = Reads::default();
        let mut stream = CountReads::new(server, reads.clone());
        drop(client);
        let mut buf = [0u8; 8];
        assert_eq!(stream.read(&mut buf).await.unwrap(), 0);
        assert_eq!(reads.now(), 0);
    }
}
