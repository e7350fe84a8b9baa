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

/// A reader of `input` decoded from `coding`.
fn decoder(coding: Coding, input: &[u8]) -> Result<Box<dyn Read + '_>, DecodeError> {
    Ok(match coding {
        Coding::Identity => Box::new(input),
        Coding::Gzip => Box::new(flate2::read::MultiGzDecoder::new(input)),
        Coding::Zstd => {
            let corrupt = |e: std::io::Error| DecodeError::Corrupt(format!("zstd: {e}"));
            let mut d = zstd::stream::read::Decoder::with_buffer(input).map_err(corrupt)?;
            d.window_log_max(ZSTD_WINDOW_LOG_MAX).map_err(corrupt)?;
            Box::new(d)
        }
    })
}

/// Reads `coding` from `input` in small pieces, handing each to `sink`; stops as soon as
/// the total passes `cap`.
fn each_piece(
    coding: Coding,
    input: &[u8],
    cap: usize,
    mut sink: impl FnMut(&[u8]) -> Result<(), DecodeError>,
) -> Result<usize, DecodeError> {
    let mut reader = decoder(coding, input)?;
    let mut piece = vec![0u8; 64 * 1024];
    let mut total = 0usize;
    loop {
        let n = match reader.read(&mut piece) {
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
/// decoded size (a bomb is refused having allocated nothing but a 64 KiB piece); `admit` is
/// then asked for exactly that many bytes (the batch budget) and may refuse; a second pass
/// fills a buffer of exactly that size.
pub fn decode_capped(
    coding: Coding,
    input: &[u8],
    cap: usize,
    admit: impl FnOnce(usize) -> bool,
) -> Result<Vec<u8>, DecodeError> {
    let size = each_piece(coding, input, cap, |_| Ok(()))?;
    if !admit(size) {
        return Err(DecodeError::Budget);
    }
    let mut out = Vec::with_capacity(size);
    each_piece(coding, input, size, |p| {
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
            assert_eq!(decode_capped(c, &enc, data.len(), |_| true).unwrap(), data);
            assert_eq!(
                decode_capped(c, &enc, data.len() - 1, |_| true),
                Err(DecodeError::TooLarge)
            );
            assert_eq!(
                decode_capped(c, &enc, data.len(), |_| false),
                Err(DecodeError::Budget)
            );
            assert!(matches!(
                decode_capped(c, &enc[..enc.len() / 2], data.len(), |_| true),
                Err(DecodeError::Corrupt(_))
            ));
        }
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
                if let Ok(out) = decode_capped(coding, &input, cap, |_| true) {
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
                match decode_capped(coding, &enc, cap, |_| true) {
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
