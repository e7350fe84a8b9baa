//! Request bodies of produce and batch produce in a `Content-Encoding` (SPEC §3.4): `gzip`,
//! `zstd` or `identity`, decoded with a hard cap, and the node-wide budget of batch bytes in
//! flight.
//!
//! The decoded size counts against the same limits as a plain body: decoding stops (`413`)
//! as soon as the output would pass the cap, and never holds more than the cap, so a
//! decompression bomb costs at most the cap in memory and the time to inflate the cap.

use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::http::{header, HeaderMap};

/// A content coding this server decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    Identity,
    Gzip,
    Zstd,
}

impl Coding {
    pub fn name(self) -> &'static str {
        match self {
            Coding::Identity => "identity",
            Coding::Gzip => "gzip",
            Coding::Zstd => "zstd",
        }
    }
}

/// The `Accept-Encoding` of a `415` on a produce route.
pub const ACCEPTED: &str = "gzip, zstd, identity";

/// The one coding of a produce body; `Err` with the offending list for an unknown or
/// stacked coding (`415`).
pub fn request_coding(headers: &HeaderMap) -> Result<Coding, String> {
    let mut list = Vec::new();
    for v in headers.get_all(header::CONTENT_ENCODING).iter() {
        let text = v.to_str().map_err(|_| "?".to_string())?;
        list.extend(
            text.split(',')
                .map(|c| c.trim().to_ascii_lowercase())
                .filter(|c| !c.is_empty() && c != "identity"),
        );
    }
    match list.as_slice() {
        [] => Ok(Coding::Identity),
        [one] if one == "gzip" || one == "x-gzip" => Ok(Coding::Gzip),
        [one] if one == "zstd" => Ok(Coding::Zstd),
        _ => Err(list.join(", ")),
    }
}

/// Why a body could not be decoded.
#[derive(Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// The decoded body would pass the cap.
    TooLarge,
    /// The budget of batch bytes in flight refused more decoded bytes.
    Budget,
    /// Not a valid stream of its coding.
    Corrupt(String),
}

/// Largest window a zstd frame may ask for (16 MiB): the decoder's own memory is bounded too.
const ZSTD_WINDOW_LOG_MAX: u32 = 24;

/// A zstd context grown past this (a frame that asked for a large window) is replaced after
/// its body rather than kept for the next one.
const ZSTD_KEEP_BYTES: usize = 4 << 20;

/// Bytes decoded per read.
const PIECE: usize = 64 * 1024;

/// What a decoding thread keeps from one body to the next: the read piece and a zstd
/// context with its window, so a body costs no allocation of its own beyond its output.
pub struct Scratch {
    piece: Vec<u8>,
    zstd: zstd::zstd_safe::DCtx<'static>,
}

impl Default for Scratch {
    fn default() -> Self {
        Self::new()
    }
}

impl Scratch {
    pub fn new() -> Scratch {
        Scratch {
            piece: vec![0u8; PIECE],
            zstd: zstd_context(),
        }
    }

    /// After a body: a context that grew large goes.
    fn settle(&mut self) {
        if self.zstd.sizeof() > ZSTD_KEEP_BYTES {
            self.zstd = zstd_context();
        }
    }
}

fn zstd_context() -> zstd::zstd_safe::DCtx<'static> {
    let mut c = zstd::zstd_safe::DCtx::create();
    c.set_parameter(zstd::zstd_safe::DParameter::WindowLogMax(
        ZSTD_WINDOW_LOG_MAX,
    ))
    .expect("invariant: zstd accepts its maximum window log in range");
    c
}

/// A reader of `input` decoded from `coding`.
fn decoder<'a>(
    coding: Coding,
    input: &'a [u8],
    zstd: &'a mut zstd::zstd_safe::DCtx<'static>,
) -> Box<dyn Read + 'a> {
    match coding {
        Coding::Identity => Box::new(input),
        Coding::Gzip => Box::new(flate2::bufread::MultiGzDecoder::new(input)),
        Coding::Zstd => Box::new(zstd::stream::read::Decoder::with_context(input, zstd)),
    }
}

/// Reads `coding` from `input` in small pieces, handing each to `sink`; stops as soon as
/// the total passes `cap`.
fn each_piece(
    coding: Coding,
    input: &[u8],
    cap: usize,
    scratch: &mut Scratch,
    mut sink: impl FnMut(&[u8]) -> Result<(), DecodeError>,
) -> Result<usize, DecodeError> {
    let Scratch { piece, zstd } = scratch;
    let mut reader = decoder(coding, input, zstd);
    let mut total = 0usize;
    loop {
        let n = match reader.read(piece) {
            Ok(0) => return Ok(total),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(DecodeError::Corrupt(format!("{}: {e}", coding.name()))),
        };
        total += n;
        if total > cap {
            return Err(DecodeError::TooLarge);
        }
        sink(&piece[..n])?;
    }
}

/// Decodes `input` in `coding` to at most `cap` bytes. A first pass only measures the
/// decoded size (a bomb is refused having allocated nothing); `admit` is then asked for
/// exactly that many bytes (the batch budget) and may refuse; a second pass fills a buffer
/// of exactly that size.
pub fn decode_capped(
    coding: Coding,
    input: &[u8],
    cap: usize,
    scratch: &mut Scratch,
    admit: impl FnOnce(usize) -> bool,
) -> Result<Vec<u8>, DecodeError> {
    let out = decode_two_passes(coding, input, cap, scratch, admit);
    scratch.settle();
    out
}

fn decode_two_passes(
    coding: Coding,
    input: &[u8],
    cap: usize,
    scratch: &mut Scratch,
    admit: impl FnOnce(usize) -> bool,
) -> Result<Vec<u8>, DecodeError> {
    let size = each_piece(coding, input, cap, scratch, |_| Ok(()))?;
    if !admit(size) {
        return Err(DecodeError::Budget);
    }
    let mut out = Vec::with_capacity(size);
    each_piece(coding, input, size, scratch, |p| {
        out.extend_from_slice(p);
        Ok(())
    })
    .map_err(|e| match e {
        // Decoding is deterministic: a second pass cannot differ from the first.
        DecodeError::TooLarge => DecodeError::Corrupt("stream changed between passes".into()),
        e => e,
    })?;
    Ok(out)
}

type Job = Box<dyn FnOnce(&mut Scratch) + Send>;

/// The node's decoding threads (one per core, at most four): compressed produce bodies are
/// decoded there, each thread with its own [`Scratch`], so decoding costs a fixed amount of
/// memory however many bodies come and however they are built (bombs, large windows), and
/// at most this many cores. Bodies wait their turn in a bounded queue (the request waits,
/// without a thread, for a place in it). The threads end when the last handle goes.
pub struct Decoders {
    jobs: crossbeam_channel::Sender<Job>,
    places: Arc<tokio::sync::Semaphore>,
}

/// Bodies waiting per decoding thread at most; more wait for a place.
const QUEUED_PER_THREAD: usize = 16;

impl Decoders {
    /// `threads` decoding threads (at least one).
    pub fn new(threads: usize) -> std::io::Result<Arc<Decoders>> {
        let threads = threads.max(1);
        let (jobs, queue) = crossbeam_channel::unbounded::<Job>();
        for i in 0..threads {
            let queue = queue.clone();
            std::thread::Builder::new()
                .name(format!("narad-decode-{i}"))
                .spawn(move || {
                    let mut scratch = Scratch::new();
                    while let Ok(job) = queue.recv() {
                        job(&mut scratch);
                    }
                })?;
        }
        Ok(Arc::new(Decoders {
            jobs,
            places: Arc::new(tokio::sync::Semaphore::new(threads * QUEUED_PER_THREAD)),
        }))
    }

    /// One per core, at most four.
    pub fn for_this_machine() -> std::io::Result<Arc<Decoders>> {
        Self::new(std::thread::available_parallelism().map_or(2, |n| n.get().min(4)))
    }

    /// [`decode_capped`] on a decoding thread, the decoded size taken from `guard` (when
    /// there is one) before the output is allocated; the guard comes back with the answer.
    pub async fn decode(
        &self,
        coding: Coding,
        input: bytes::Bytes,
        cap: usize,
        mut guard: Option<BudgetGuard>,
    ) -> (Result<Vec<u8>, DecodeError>, Option<BudgetGuard>) {
        let place = self
            .places
            .clone()
            .acquire_owned()
            .await
            .expect("invariant: the semaphore is never closed");
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move |scratch| {
            let out = decode_capped(coding, &input, cap, scratch, |n| {
                guard.as_mut().is_none_or(|g| g.grow(n as u64))
            });
            drop(place);
            // The body goes back to be freed where it was allocated: a buffer freed on
            // another thread waits there for its owner's allocator to collect it, and
            // bodies of a megabyte each piled up that way for a while.
            let _ = tx.send((out, guard, input));
        });
        if self.jobs.send(job).is_err() {
            unreachable!("invariant: the decoding threads outlive every handle");
        }
        let (out, guard, _input) = rx
            .await
            .expect("invariant: a decoding thread answers every job it takes");
        (out, guard)
    }
}

/// What the produce routes share to read bodies (part of the router's `ApiState`): the budget of
/// batch bytes in flight and the decoding threads.
pub struct Bodies {
    pub budget: Arc<BatchBudget>,
    pub decoders: Arc<Decoders>,
}

/// The node-wide budget of batch-produce bytes in flight (`http.max_batch_bytes_in_flight`):
/// bytes received and decoded by batch requests not yet answered.
#[derive(Debug)]
pub struct BatchBudget {
    limit: u64,
    used: AtomicU64,
}

impl BatchBudget {
    pub fn new(limit: u64) -> Arc<BatchBudget> {
        Arc::new(BatchBudget {
            limit,
            used: AtomicU64::new(0),
        })
    }

    /// Bytes held now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }

    /// An empty reservation, released when dropped.
    pub fn guard(self: &Arc<Self>) -> BudgetGuard {
        BudgetGuard {
            budget: self.clone(),
            held: 0,
        }
    }
}

/// A request's share of the [`BatchBudget`]; dropping it (answer sent, error, cancelled
/// request) gives the bytes back.
#[derive(Debug)]
pub struct BudgetGuard {
    budget: Arc<BatchBudget>,
    held: u64,
}

impl BudgetGuard {
    /// Takes `n` more bytes if the budget has room, or if no other request holds any (so a
    /// batch within the per-request limits always gets through eventually).
    pub fn grow(&mut self, n: u64) -> bool {
        let used = &self.budget.used;
        let mut cur = used.load(Ordering::Acquire);
        loop {
            let alone = cur == self.held;
            if !alone && cur.saturating_add(n) > self.budget.limit {
                return false;
            }
            match used.compare_exchange_weak(cur, cur + n, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    self.held += n;
                    return true;
                }
                Err(now) => cur = now,
            }
        }
    }

    pub fn held(&self) -> u64 {
        self.held
    }
}

impl Drop for BudgetGuard {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.held, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    #[test]
    fn codings() {
        let h = |v: &[&str]| {
            let mut m = HeaderMap::new();
            for x in v {
                m.append(header::CONTENT_ENCODING, x.parse().unwrap());
            }
            request_coding(&m)
        };
        assert_eq!(h(&[]), Ok(Coding::Identity));
        assert_eq!(h(&["identity"]), Ok(Coding::Identity));
        assert_eq!(h(&[" GZIP "]), Ok(Coding::Gzip));
        assert_eq!(h(&["zstd"]), Ok(Coding::Zstd));
        assert_eq!(h(&["identity, zstd"]), Ok(Coding::Zstd));
        assert!(h(&["br"]).is_err());
        assert!(h(&["gzip, zstd"]).is_err());
        assert!(h(&["gzip", "gzip"]).is_err());
    }

    #[test]
    fn round_trip_and_caps() {
        let data = b"hello hello hello".repeat(1000);
        let z = zstd::encode_all(&data[..], 3).unwrap();
        for (c, enc) in [(Coding::Gzip, gzip(&data)), (Coding::Zstd, z)] {
            assert_eq!(
                decode_capped(c, &enc, data.len(), &mut Scratch::new(), |_| true).unwrap(),
                data
            );
            assert_eq!(
                decode_capped(c, &enc, data.len() - 1, &mut Scratch::new(), |_| true),
                Err(DecodeError::TooLarge)
            );
            assert_eq!(
                decode_capped(c, &enc, data.len(), &mut Scratch::new(), |_| false),
                Err(DecodeError::Budget)
            );
            assert!(matches!(
                decode_capped(
                    c,
                    &enc[..enc.len() / 2],
                    data.len(),
                    &mut Scratch::new(),
                    |_| true
                ),
                Err(DecodeError::Corrupt(_))
            ));
        }
    }

    /// One thread's scratch serves body after body: a body cut off or over the cap leaves
    /// nothing behind for the next one, and a context grown by a large window is dropped.
    #[test]
    fn scratch_is_reused_across_bodies() {
        let data = b"0123456789abcdef".repeat(10_000);
        let z = zstd::encode_all(&data[..], 3).unwrap();
        let g = gzip(&data);
        let mut scratch = Scratch::new();
        for _ in 0..3 {
            for (c, enc) in [(Coding::Zstd, &z), (Coding::Gzip, &g)] {
                assert!(matches!(
                    decode_capped(c, &enc[..enc.len() / 3], data.len(), &mut scratch, |_| true),
                    Err(DecodeError::Corrupt(_))
                ));
                assert_eq!(
                    decode_capped(c, enc, 1000, &mut scratch, |_| true),
                    Err(DecodeError::TooLarge)
                );
                assert_eq!(
                    decode_capped(c, enc, data.len(), &mut scratch, |_| true).unwrap(),
                    data
                );
            }
        }
        // A frame with a 16 MiB window: decoded, and its context not kept.
        let big = {
            let mut e = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
            e.window_log(24).unwrap();
            e.write_all(&data).unwrap();
            e.finish().unwrap()
        };
        assert_eq!(
            decode_capped(Coding::Zstd, &big, data.len(), &mut scratch, |_| true).unwrap(),
            data
        );
        assert!(scratch.zstd.sizeof() <= ZSTD_KEEP_BYTES);
    }

    /// The decoding threads answer every body, with the budget guard back.
    #[tokio::test]
    async fn decoders_answer_and_return_the_guard() {
        let decoders = Decoders::new(2).unwrap();
        let data = b"payload ".repeat(5000);
        let enc = bytes::Bytes::from(gzip(&data));
        let budget = BatchBudget::new(64 << 20);
        let all =
            futures::future::join_all((0..100).map(|_| {
                decoders.decode(Coding::Gzip, enc.clone(), data.len(), Some(budget.guard()))
            }))
            .await;
        for (out, guard) in all {
            assert_eq!(out.unwrap(), data);
            assert!(guard.unwrap().held() >= data.len() as u64);
        }
        assert_eq!(budget.used(), 0);
        let (out, guard) = decoders.decode(Coding::Zstd, enc, 10, None).await;
        assert!(matches!(out, Err(DecodeError::Corrupt(_))) && guard.is_none());
    }

    #[test]
    fn budget_guards_release() {
        let b = BatchBudget::new(100);
        let mut g1 = b.guard();
        assert!(g1.grow(150), "alone, a request always gets through");
        let mut g2 = b.guard();
        assert!(!g2.grow(1));
        drop(g1);
        assert!(g2.grow(60));
        let mut g3 = b.guard();
        assert!(g3.grow(40));
        assert!(!g3.grow(1));
        drop((g2, g3));
        assert_eq!(b.used(), 0);
    }

    mod props {
        use super::super::*;
        use super::gzip;
        use proptest::prelude::*;

        proptest! {
            /// Arbitrary bytes in any coding: an answer, never a panic, never over the cap.
            #[test]
            fn prop_decode_never_panics_nor_passes_the_cap(
                input in proptest::collection::vec(any::<u8>(), 0..2048),
                cap in 0..4096usize,
                coding in prop_oneof![Just(Coding::Gzip), Just(Coding::Zstd), Just(Coding::Identity)],
            ) {
                if let Ok(out) = decode_capped(coding, &input, cap, &mut Scratch::new(), |_| true) {
                    prop_assert!(out.len() <= cap);
                }
            }

            /// A valid stream, truncated or with one byte flipped: decoded exactly, refused,
            /// or (for a flip the format cannot see) some output, always within the cap.
            #[test]
            fn prop_valid_streams_within_the_cap(
                data in proptest::collection::vec(0..4u8, 0..20_000),
                cap in 0..25_000usize,
                zstd_not_gzip in any::<bool>(),
                flip in proptest::option::of((any::<proptest::sample::Index>(), 1..=255u8)),
            ) {
                let (coding, mut enc) = if zstd_not_gzip {
                    (Coding::Zstd, zstd::encode_all(&data[..], 1).unwrap())
                } else {
                    (Coding::Gzip, gzip(&data))
                };
                if let Some((i, x)) = flip {
                    let i = i.index(enc.len());
                    enc[i] ^= x;
                }
                match decode_capped(coding, &enc, cap, &mut Scratch::new(), |_| true) {
                    Ok(out) => {
                        prop_assert!(out.len() <= cap);
                        if flip.is_none() {
                            prop_assert_eq!(out, data);
                        }
                    }
                    Err(DecodeError::TooLarge) => prop_assert!(flip.is_some() || data.len() > cap),
                    Err(DecodeError::Corrupt(_)) => prop_assert!(flip.is_some()),
                    Err(DecodeError::Budget) => prop_assert!(false),
                }
            }
        }
    }
}
