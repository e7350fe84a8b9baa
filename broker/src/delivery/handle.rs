//! Receipt handles (SPEC §3.5): `partition:offset:nonce`, the lease a consumer settles.

use std::fmt;
use std::str::FromStr;

/// One lease: the partition and offset of the leased message and the nonce of this lease
/// (a redelivery gets a new one, so an older handle of the same message is stale).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReceiptHandle {
    pub partition: u32,
    pub offset: u64,
    pub nonce: u64,
}

/// Why a string is no receipt handle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandleError {
    Empty,
    /// Not three decimal numbers separated by `:` (the text as given).
    Malformed(String),
}

impl fmt::Display for HandleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HandleError::Empty => f.write_str("receipt_handle is empty"),
            HandleError::Malformed(h) => write!(f, "malformed receipt_handle {h:?}"),
        }
    }
}

impl std::error::Error for HandleError {}

impl FromStr for ReceiptHandle {
    type Err = HandleError;

    fn from_str(h: &str) -> Result<Self, HandleError> {
        if h.is_empty() {
            return Err(HandleError::Empty);
        }
        let bad = || HandleError::Malformed(h.to_string());
        let mut it = h.split(':');
        let (Some(p), Some(o), Some(n), None) = (it.next(), it.next(), it.next(), it.next()) else {
            return Err(bad());
        };
        Ok(ReceiptHandle {
            partition: p.parse().map_err(|_| bad())?,
            offset: o.parse().map_err(|_| bad())?,
            nonce: n.parse().map_err(|_| bad())?,
        })
    }
}

impl ReceiptHandle {
    /// The handle's text, `partition:offset:nonce`, handed to `put` piece by piece: the one
    /// definition of the form behind both `Display` and [`Self::write_to`].
    fn pieces(&self, mut put: impl FnMut(&str) -> fmt::Result) -> fmt::Result {
        let mut n = itoa::Buffer::new();
        put(n.format(self.partition))?;
        put(":")?;
        put(n.format(self.offset))?;
        put(":")?;
        put(n.format(self.nonce))
    }

    /// Appends the handle's text to `out`, as `Display` writes it, without the formatting
    /// machinery: every consumed message carries one.
    pub fn write_to(&self, out: &mut Vec<u8>) {
        let _ = self.pieces(|s| {
            out.extend_from_slice(s.as_bytes());
            Ok(())
        });
    }
}

impl fmt::Display for ReceiptHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.pieces(|s| f.write_str(s))
    }
}

impl From<HandleError> for crate::error::ApiError {
    fn from(e: HandleError) -> Self {
        crate::error::ApiError::bad_request(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn refusals_name_the_handle() {
        assert_eq!(
            "".parse::<ReceiptHandle>().unwrap_err().to_string(),
            "receipt_handle is empty"
        );
        assert_eq!(
            "1:2".parse::<ReceiptHandle>().unwrap_err().to_string(),
            "malformed receipt_handle \"1:2\""
        );
        for h in [
            "1:2:3:4",
            "a:2:3",
            "1:-2:3",
            "4294967296:0:0",
            "1::3",
            " 1:2:3",
        ] {
            assert!(h.parse::<ReceiptHandle>().is_err(), "{h}");
        }
    }

    fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            any::<String>(),
            "[+-]?[0-9]{0,22}",
            "[0-9:+-]{0,30}",
            "([0-9]{1,21}:){0,4}[0-9]{0,21}",
        ]
    }

    proptest! {
        /// Every handle a node hands out parses back to its parts.
        #[test]
        fn prop_receipt_handle_roundtrip(partition in any::<u32>(), offset in any::<u64>(), nonce in any::<u64>()) {
            let h = ReceiptHandle { partition, offset, nonce };
            prop_assert_eq!(h.to_string().parse::<ReceiptHandle>(), Ok(h));
            let mut written = Vec::new();
            h.write_to(&mut written);
            prop_assert_eq!(String::from_utf8(written).unwrap(), h.to_string());
        }

        /// Anything else parses only if it is exactly three numbers in range, and then says so.
        #[test]
        fn prop_receipt_handle_arbitrary(h in prop_oneof![
            text(),
            (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(p, o, n)| format!("{p}:{o}:{n}")),
        ]) {
            match h.parse::<ReceiptHandle>() {
                Ok(r) => {
                    let parts: Vec<&str> = h.split(':').collect();
                    prop_assert_eq!(parts.len(), 3);
                    prop_assert_eq!(parts[0].parse::<u32>().ok(), Some(r.partition));
                    prop_assert_eq!(parts[1].parse::<u64>().ok(), Some(r.offset));
                    prop_assert_eq!(parts[2].parse::<u64>().ok(), Some(r.nonce));
                }
                Err(HandleError::Empty) => prop_assert!(h.is_empty()),
                Err(HandleError::Malformed(t)) => prop_assert_eq!(t, h),
            }
        }
    }
}
