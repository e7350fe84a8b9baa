//! Wall-clock time as Unix milliseconds and microseconds: what records, leases and metadata
//! commands are stamped with. (Durations and deadlines use `Instant`.)

use std::time::{SystemTime, UNIX_EPOCH};

/// Unix time in milliseconds (0 if the clock is before 1970).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Unix time in microseconds (0 if the clock is before 1970).
pub fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}
