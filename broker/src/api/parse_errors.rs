//! JSON bodies for the answers hyper writes by itself (SPEC §3.1: every error body is
//! `{"error":"…"}`, from every layer).
//!
//! hyper's HTTP/1 server answers a request head it cannot parse before any service runs, and
//! then closes the connection: `400` (bad request line or header; a `Content-Length` that is
//! not one decimal number, or two that disagree; a `Transfer-Encoding` whose last coding is
//! not `chunked`, RFC 9112 §6.3), `431` (a head larger than hyper's read buffer, about
//! 400 KiB, or more than [`MAX_HEADERS`] header fields) and `414` (a request target longer
//! than 65534 bytes). It writes those with an empty body, and hyper 1.x has no option or hook
//! to shape them (`http1::Builder` has none; hyperium/hyper#3844 asks for one).
//!
//! [`JsonParseErrors`] sits between hyper and the connection and replaces exactly those
//! answers. It follows the response stream (each head, then its body by `Content-Length`),
//! and [`PendingRequests`] counts the requests that reached the service: hyper writes a final
//! response head for such a request only after the service was called, so a final head
//! written while no request waits for its answer is hyper's own. That head is replaced with
//! the same status, `Content-Type: application/json`, `Connection: close` and a
//! `{"error":"…"}` body; the connection then closes as hyper intended. Everything else passes
//! through unchanged (a body goes out in the same vectored write as its head). A stream the
//! wrapper cannot follow (a chunked or close-delimited body, which the API never sends) is
//! passed through untouched from then on.
//!
//! A head that does not arrive within `read_timeout` is not answered (hyper closes the
//! connection without a response), nor is a connection that ends mid-head.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use axum::http::StatusCode;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::error::error_body;

/// Most header fields in a request head (hyper's default, set explicitly); more is `431`.
pub const MAX_HEADERS: usize = 100;

/// Most slices one vectored write passes on (hyper writes a head and a body, or a few chunks).
const MAX_SLICES: usize = 8;

/// Longest response head the wrapper buffers while following the stream; a longer one (the
/// API writes none) makes it step aside.
const MAX_RESPONSE_HEAD: usize = 64 * 1024;

/// The requests of one connection that reached the service and wait for their answer's head,
/// in order (`true` for a HEAD request, whose answer has no body).
#[derive(Default)]
pub struct PendingRequests(Mutex<VecDeque<bool>>);

impl PendingRequests {
    /// A request reached the service (called before the service can answer it).
    pub fn arrived(&self, is_head: bool) {
        self.0.lock().push_back(is_head);
    }

    fn answered(&self) -> Option<bool> {
        self.0.lock().pop_front()
    }
}

/// Where the response stream stands.
#[derive(Debug, PartialEq, Eq)]
enum Out {
    /// Collecting a response head, in `out` from `start` on. Nothing from `start` on goes out
    /// before the head is complete.
    Head { start: usize },
    /// Passing this many body bytes through.
    Body(u64),
    /// No longer following the stream: everything passes through.
    Through,
    /// hyper's own answer was replaced; nothing else it writes goes out.
    Discard,
}

/// An I/O stream whose writes are followed as HTTP/1.1 responses, with hyper's own parse-error
/// answers replaced by JSON ones (see the module doc).
pub struct JsonParseErrors<I> {
    inner: I,
    pending: Arc<PendingRequests>,
    state: Out,
    /// Bytes accepted from hyper and not yet written to `inner` (heads, and the head being
    /// collected). Kept between answers, so that following a head allocates nothing.
    out: Vec<u8>,
    out_pos: usize,
}

impl<I> JsonParseErrors<I> {
    pub fn new(inner: I, pending: Arc<PendingRequests>) -> Self {
        JsonParseErrors {
            inner,
            pending,
            state: Out::Head { start: 0 },
            out: Vec::new(),
            out_pos: 0,
        }
    }

    /// Collecting the next response head, from what is queued now on.
    fn next_head(&self) -> Out {
        Out::Head {
            start: self.out.len(),
        }
    }

    /// How much of `out` may be written: all but a head still being collected.
    fn settled(&self) -> usize {
        match self.state {
            Out::Head { start, .. } => start,
            _ => self.out.len(),
        }
    }

    /// Takes head bytes from the front of `bufs` while a head is being collected; returns how
    /// many it took. Stops where a body starts.
    fn absorb(&mut self, bufs: &[IoSlice<'_>]) -> usize {
        let mut took = 0;
        for b in bufs {
            let mut i = 0;
            while i < b.len() {
                match self.state {
                    Out::Head { start } => {
                        let rest = &b[i..];
                        let (n, done) = match head_end(&self.out[start..], rest) {
                            Some(n) => (n, true),
                            None => (rest.len(), false),
                        };
                        self.out.extend_from_slice(&rest[..n]);
                        took += n;
                        i += n;
                        if done {
                            self.finish_head(start);
                        } else {
                            let head = &self.out[start..];
                            let stray = head.len() >= 5 && !head.starts_with(b"HTTP/");
                            if stray || head.len() > MAX_RESPONSE_HEAD {
                                self.state = Out::Through;
                            }
                        }
                    }
                    Out::Discard => {
                        took += b.len() - i;
                        i = b.len();
                    }
                    Out::Body(_) | Out::Through => return took,
                }
            }
        }
        took
    }

    /// The response head in `out` from `start` on is complete: leave it queued (or put its
    /// JSON replacement in its place) and follow its body.
    fn finish_head(&mut self, start: usize) {
        let head = &self.out[start..];
        let Some(status) = status_of(head) else {
            self.state = Out::Through;
            return;
        };
        if status == 101 {
            self.state = Out::Through;
            return;
        }
        if (100..200).contains(&status) {
            // Interim (`100 Continue`): the final answer follows.
            self.state = self.next_head();
            return;
        }
        let Some(is_head) = self.pending.answered() else {
            // No request waits for an answer: this is hyper's own, for a head it refused.
            let answer = json_answer(status, head);
            self.out.truncate(start);
            self.out.extend_from_slice(&answer);
            self.state = Out::Discard;
            return;
        };
        let body = if is_head || status == 204 || status == 304 {
            Some(0)
        } else {
            body_length(head)
        };
        self.state = match body {
            Some(0) => self.next_head(),
            Some(n) => Out::Body(n),
            None => Out::Through,
        };
    }
}

impl<I: AsyncWrite + Unpin> JsonParseErrors<I> {
    /// Writes what is queued in `out`, but a head still being collected.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let settled = self.settled();
        while self.out_pos < settled {
            let n =
                ready!(Pin::new(&mut self.inner).poll_write(cx, &self.out[self.out_pos..settled]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.out_pos += n;
        }
        // What is left is the start of a head: it moves to the front.
        self.out.drain(..settled);
        self.out_pos = 0;
        if let Out::Head { start, .. } = &mut self.state {
            *start = 0;
        }
        Poll::Ready(Ok(()))
    }

    /// Writes the queued bytes and then up to `limit` bytes of `bufs`, in one vectored write
    /// where the stream allows; returns how many bytes of `bufs` went out.
    fn poll_pass(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
        limit: u64,
    ) -> Poll<io::Result<usize>> {
        loop {
            let queued = self.out.len() - self.out_pos;
            // On the stack: this runs for every write of every response. A write may take
            // fewer slices than offered (the caller writes the rest next).
            let mut slices = [IoSlice::new(&[]); MAX_SLICES];
            let mut used = 0;
            if queued > 0 {
                slices[0] = IoSlice::new(&self.out[self.out_pos..]);
                used = 1;
            }
            let mut left = limit;
            for b in bufs {
                if left == 0 || used == MAX_SLICES {
                    break;
                }
                let k = (b.len() as u64).min(left) as usize;
                if k > 0 {
                    slices[used] = IoSlice::new(&b[..k]);
                    used += 1;
                    left -= k as u64;
                }
            }
            if used == 0 {
                return Poll::Ready(Ok(0));
            }
            let n = ready!(Pin::new(&mut self.inner).poll_write_vectored(cx, &slices[..used]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            let from_out = n.min(queued);
            self.out_pos += from_out;
            if self.out_pos == self.out.len() {
                self.out.clear();
                self.out_pos = 0;
            }
            let passed = n - from_out;
            if passed > 0 {
                if let Out::Body(rest) = &mut self.state {
                    *rest -= passed as u64;
                    if *rest == 0 {
                        self.state = self.next_head();
                    }
                }
                return Poll::Ready(Ok(passed));
            }
            // Only queued bytes went out: go on with the caller's.
        }
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for JsonParseErrors<I> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match this.state {
            Out::Through => this.poll_pass(cx, bufs, u64::MAX),
            Out::Body(n) => this.poll_pass(cx, bufs, n),
            Out::Head { .. } | Out::Discard => {
                if this.settled() - this.out_pos > MAX_RESPONSE_HEAD {
                    ready!(this.poll_drain(cx))?;
                }
                // Taken into `out`; it goes out with the body that follows, or on flush.
                Poll::Ready(Ok(this.absorb(bufs)))
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        ready!(Pin::new(&mut this.inner).poll_flush(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for JsonParseErrors<I> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

/// How many bytes of `next` complete a response head of which `collected` (holding no
/// `\r\n\r\n`) came before: up to and including the blank line's `\r\n\r\n`, which may
/// begin in `collected`. `None` if `next` does not complete it. Only the head is looked at
/// (and copied by the caller), never the body after it.
fn head_end(collected: &[u8], next: &[u8]) -> Option<usize> {
    const END: &[u8] = b"\r\n\r\n";
    // A blank line that straddles the two: at most three bytes on each side.
    let k = collected.len().min(3);
    let m = next.len().min(3);
    let mut seam = [0u8; 6];
    seam[..k].copy_from_slice(&collected[collected.len() - k..]);
    seam[k..k + m].copy_from_slice(&next[..m]);
    if let Some(at) = memchr::memmem::find(&seam[..k + m], END) {
        return Some(at + END.len() - k);
    }
    memchr::memmem::find(next, END).map(|at| at + END.len())
}

/// The status code of a response head (`HTTP/1.x NNN …`).
fn status_of(head: &[u8]) -> Option<u16> {
    let line = head.split(|&b| b == b'\r').next()?;
    let rest = line
        .strip_prefix(b"HTTP/1.1 ")
        .or_else(|| line.strip_prefix(b"HTTP/1.0 "))?;
    let code = rest.get(..3)?;
    if !code.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(code).ok()?.parse().ok()
}

/// The header fields of a response head, as (name, value) with surrounding whitespace
/// trimmed. Without validating the whole head as text: every answer's head passes here.
fn fields(head: &[u8]) -> impl Iterator<Item = (&[u8], &[u8])> {
    // Lines found with `memchr`: a byte-by-byte split costs more than the rest of the walk.
    let mut rest = memchr::memchr(b'\n', head).map_or(&head[head.len()..], |n| &head[n + 1..]);
    std::iter::from_fn(move || {
        while !rest.is_empty() {
            let (line, next) = match memchr::memchr(b'\n', rest) {
                Some(n) => (&rest[..n], &rest[n + 1..]),
                None => (rest, &rest[rest.len()..]),
            };
            rest = next;
            if let Some(colon) = memchr::memchr(b':', line) {
                return Some((line[..colon].trim_ascii(), line[colon + 1..].trim_ascii()));
            }
        }
        None
    })
}

/// The value of header `name` (lower case) in a response head.
fn header<'a>(head: &'a [u8], name: &str) -> Option<&'a str> {
    fields(head)
        .find(|(n, _)| n.eq_ignore_ascii_case(name.as_bytes()))
        .and_then(|(_, v)| std::str::from_utf8(v).ok())
}

/// How a response's body is delimited, read in one pass over its head: `Some(n)` for
/// `Content-Length: n`, `None` for a chunked or close-delimited body (a `Transfer-Encoding`,
/// or no usable length).
fn body_length(head: &[u8]) -> Option<u64> {
    let mut length = None;
    for (name, value) in fields(head) {
        if name.eq_ignore_ascii_case(b"transfer-encoding") {
            return None;
        }
        if length.is_none() && name.eq_ignore_ascii_case(b"content-length") {
            length = Some(std::str::from_utf8(value).ok().and_then(|v| v.parse().ok()));
        }
    }
    length.flatten()
}

/// What a client is told for each of hyper's own answers.
fn message(status: u16) -> String {
    match status {
        400 => "malformed request: the request line or a header could not be parsed (a \
                Content-Length must be one decimal number, a Transfer-Encoding must end in \
                chunked)"
            .to_string(),
        431 => format!(
            "request header fields too large: at most {MAX_HEADERS} header fields and about \
             400 KiB of request head"
        ),
        414 => "request target too long".to_string(),
        other => StatusCode::from_u16(other)
            .ok()
            .and_then(|s| s.canonical_reason())
            .unwrap_or("request refused")
            .to_ascii_lowercase(),
    }
}

/// The JSON answer that replaces hyper's empty one with the same status (and its `Date`).
fn json_answer(status: u16, hyper_head: &[u8]) -> Vec<u8> {
    let body = error_body(&message(status));
    let reason = StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("Error");
    let mut out = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
        body.len()
    );
    if let Some(date) = header(hyper_head, "date") {
        out.push_str(&format!("date: {date}\r\n"));
    }
    out.push_str("\r\n");
    out.push_str(&body);
    out.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// Writes `chunks` (each as one vectored write of its slices) through the wrapper, with
    /// `requests` having reached the service first; returns what reached the connection.
    async fn through(requests: &[bool], chunks: &[&[&[u8]]]) -> String {
        String::from_utf8(through_bytes(requests, chunks).await).unwrap()
    }

    async fn through_bytes(requests: &[bool], chunks: &[&[&[u8]]]) -> Vec<u8> {
        let pending = Arc::new(PendingRequests::default());
        for r in requests {
            pending.arrived(*r);
        }
        let mut w = JsonParseErrors::new(Vec::<u8>::new(), pending);
        for chunk in chunks {
            let mut slices: Vec<IoSlice<'_>> = chunk.iter().map(|s| IoSlice::new(s)).collect();
            let mut slices = &mut slices[..];
            while !slices.is_empty() {
                let n = w.write_vectored(slices).await.unwrap();
                IoSlice::advance_slices(&mut slices, n);
            }
        }
        w.flush().await.unwrap();
        w.inner
    }

    const OK: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\ndate: Thu, 01 Jan 2026 00:00:00 GMT\r\n\r\n";
    const AUTO_431: &[u8] = b"HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\ncontent-length: 0\r\ndate: Thu, 01 Jan 2026 00:00:00 GMT\r\n\r\n";

    #[tokio::test]
    async fn answers_to_requests_pass_through_unchanged() {
        let out = through(&[false], &[&[OK, b"{\"a\":\"\r\n\"}"]]).await;
        assert_eq!(out.as_bytes(), [OK, b"{\"a\":\"\r\n\"}"].concat());
        // Head and body in separate writes, byte by byte too.
        let whole = [OK, b"{\"a\":\"\r\n\"}"].concat();
        let bytes: Vec<&[u8]> = whole.chunks(1).collect();
        let chunks: Vec<&[&[u8]]> = bytes.iter().map(std::slice::from_ref).collect();
        assert_eq!(through(&[false], &chunks).await.as_bytes(), whole);
    }

    #[tokio::test]
    async fn a_flush_sends_no_half_collected_head() {
        let pending = Arc::new(PendingRequests::default());
        pending.arrived(false);
        pending.arrived(false);
        let mut w = JsonParseErrors::new(Vec::<u8>::new(), pending);
        let body = b"{\"a\":\"bcd\"}";
        // A whole answer and the start of the next head, then a flush: only the answer goes.
        w.write_all(&[OK, body, &OK[..20]].concat()).await.unwrap();
        w.flush().await.unwrap();
        assert_eq!(w.inner, [OK, body].concat());
        // The rest of that head and its body: both answers, whole, in order.
        w.write_all(&[&OK[20..], body].concat()).await.unwrap();
        w.flush().await.unwrap();
        assert_eq!(w.inner, [OK, body, OK, body].concat());
    }

    #[tokio::test]
    async fn hypers_own_answer_gets_a_json_body() {
        let out = through(&[], &[&[AUTO_431]]).await;
        let (head, body) = out.split_once("\r\n\r\n").unwrap();
        assert!(
            head.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"),
            "{out}"
        );
        assert!(head.contains("content-type: application/json"), "{out}");
        assert!(head.contains("connection: close"), "{out}");
        assert!(
            head.contains("date: Thu, 01 Jan 2026 00:00:00 GMT"),
            "{out}"
        );
        assert!(
            head.contains(&format!("content-length: {}", body.len())),
            "{out}"
        );
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert!(v["error"].as_str().unwrap().contains("too large"), "{v}");
        assert_eq!(v.as_object().unwrap().len(), 1);
    }

    #[tokio::test]
    async fn an_answer_after_served_requests_is_still_found() {
        // A pipelined good request, then a head hyper refused: both in one write.
        let out = through(&[false], &[&[OK, b"{\"a\":\"b\"}xx", AUTO_431]]).await;
        assert!(out.starts_with(std::str::from_utf8(OK).unwrap()), "{out}");
        let second = &out[OK.len() + 11..];
        assert!(second.starts_with("HTTP/1.1 431 "), "{out}");
        assert!(second.contains(r#"{"error":"#), "{out}");
    }

    #[tokio::test]
    async fn interim_head_and_bodiless_answers_are_followed() {
        let cont: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";
        let no_content: &[u8] = b"HTTP/1.1 204 No Content\r\ndate: x\r\n\r\n";
        // A HEAD answer announces a length but carries no body.
        let head_answer: &[u8] =
            b"HTTP/1.1 405 Method Not Allowed\r\ncontent-length: 28\r\nallow: GET\r\n\r\n";
        let auto_400: &[u8] = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n";
        let out = through(
            &[false, true],
            &[&[cont], &[no_content], &[head_answer], &[auto_400]],
        )
        .await;
        let expected_prefix = [cont, no_content, head_answer].concat();
        assert!(out.as_bytes().starts_with(&expected_prefix), "{out}");
        let last = &out[expected_prefix.len()..];
        assert!(last.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{out}");
        assert!(
            last.contains("Content-Length must be one decimal number"),
            "{out}"
        );
    }

    #[tokio::test]
    async fn streams_it_cannot_follow_pass_through() {
        let chunked: &[u8] = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n";
        let rest: &[u8] = b"5\r\nhello\r\n0\r\n\r\nHTTP/1.1 400 Bad Request\r\n\r\n";
        let out = through(&[false], &[&[chunked, rest]]).await;
        assert_eq!(out.as_bytes(), [chunked, rest].concat());
        // Bytes that are not a response at all.
        let out = through(&[], &[&[b"garbage\r\n\r\n"]]).await;
        assert_eq!(out, "garbage\r\n\r\n");
    }

    proptest::proptest! {
        /// Answers to requests, with bodies of any bytes (a body may hold `\r\n\r\n` or a
        /// whole response image), pass through unchanged however hyper splits its writes,
        /// and a refused head after them is still found and replaced.
        #[test]
        fn answers_pass_through_however_they_are_split(
            bodies in proptest::collection::vec(proptest::collection::vec(
                proptest::prop_oneof![proptest::prelude::any::<u8>(), proptest::sample::select(b"\r\nHTTP/".to_vec())],
                0..40), 1..5),
            cuts in proptest::collection::vec(0usize..400, 0..12),
        ) {
            let mut stream = Vec::new();
            for body in &bodies {
                stream.extend_from_slice(format!(
                    "HTTP/1.1 200 OK\r\nContent-Length:{}\r\nx-narad: a:b\r\n\r\n", body.len()).as_bytes());
                stream.extend_from_slice(body);
            }
            let answers = stream.len();
            stream.extend_from_slice(AUTO_431);
            let mut at: Vec<usize> = cuts.iter().map(|c| c % (stream.len() + 1)).collect();
            at.push(0);
            at.push(stream.len());
            at.sort_unstable();
            let pieces: Vec<&[u8]> = at.windows(2).map(|w| &stream[w[0]..w[1]]).collect();
            let chunks: Vec<&[&[u8]]> = pieces.chunks(2).collect();
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let out = rt.block_on(through_bytes(&vec![false; bodies.len()], &chunks));
            proptest::prop_assert_eq!(&out[..answers], &stream[..answers]);
            let last = &out[answers..];
            proptest::prop_assert!(last.starts_with(b"HTTP/1.1 431 "), "{}", String::from_utf8_lossy(last));
            let error = String::from_utf8_lossy(last).contains(r#"{"error":"#);
            proptest::prop_assert!(error, "{}", String::from_utf8_lossy(last));
        }
    }

    #[test]
    fn a_head_ends_at_its_blank_line_wherever_writes_split_it() {
        let head = b"HTTP/1.1 200 OK\r\nx: 1\r\n\r\nbody\r\n\r\n";
        let end = head.len() - "body\r\n\r\n".len();
        // Cut anywhere before the blank line ends: the bytes after the cut that complete
        // the head, and not the body's own blank line.
        for cut in 0..end {
            let (a, b) = head.split_at(cut);
            assert_eq!(head_end(a, b), Some(end - cut), "cut at {cut}");
        }
        assert_eq!(head_end(b"", b"\r\n\r\n"), Some(4));
        assert_eq!(head_end(b"HTTP/1.1 200 OK\r\n", b"\r\n"), Some(2));
        assert_eq!(head_end(b"HTTP/1.1 200 OK\r\n\r", b"\nrest"), Some(1));
        assert_eq!(head_end(b"HTTP/1.1 200 OK\r\n", b"x: 1\r\n"), None);
    }

    #[test]
    fn status_and_headers() {
        assert_eq!(status_of(AUTO_431), Some(431));
        assert_eq!(status_of(b"HTTP/1.0 200 OK\r\n\r\n"), Some(200));
        assert_eq!(status_of(b"HTTP/2 200\r\n\r\n"), None);
        assert_eq!(header(OK, "Content-Length"), Some("11"));
        assert_eq!(header(OK, "allow"), None);
        assert_eq!(header(OK, "date"), Some("Thu, 01 Jan 2026 00:00:00 GMT"));
        // The status line is not a header, and a last line without its newline is.
        assert_eq!(header(b"HTTP/1.1 200 OK\r\nx: 1\r\ny:2", "y"), Some("2"));
        assert_eq!(header(b"content-length: 1\r\n\r\n", "content-length"), None);
    }

    #[test]
    fn a_body_is_followed_by_its_length_unless_a_transfer_coding_frames_it() {
        assert_eq!(body_length(OK), Some(11));
        assert_eq!(
            body_length(b"HTTP/1.1 200 OK\r\nContent-Length:  0 \r\n\r\n"),
            Some(0)
        );
        // The first length counts; a transfer coding wins wherever it stands.
        let two = b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\ncontent-length: 4\r\n\r\n";
        assert_eq!(body_length(two), Some(3));
        for te in [
            &b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\ncontent-length: 3\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n",
        ] {
            assert_eq!(body_length(te), None);
        }
        assert_eq!(
            body_length(b"HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n"),
            None
        );
        assert_eq!(body_length(b"HTTP/1.1 200 OK\r\n\r\n"), None);
    }
}
