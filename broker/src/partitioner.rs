//! Which partition a key belongs to (SPEC §2.3, §5.1): FNV-1a-32 of the key modulo the
//! partition count. Produce and fan-out both route keyed records with it, so a key lands on
//! the same partition index of every topic with the same count.

/// FNV-1a, 32 bits (SPEC §2.3).
pub fn fnv1a32(bytes: &[u8]) -> u32 {
    let mut h: u32 = 2_166_136_261;
    for b in bytes {
        h ^= *b as u32;
        h = h.wrapping_mul(16_777_619);
    }
    h
}

/// The partition of `key` among `partitions` (at least 1).
pub fn key_partition(key: &[u8], partitions: u32) -> u32 {
    fnv1a32(key) % partitions.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_vectors_from_the_spec() {
        assert_eq!(fnv1a32(b""), 2_166_136_261);
        assert_eq!(fnv1a32(b"a"), 0xe40c292c);
        assert_eq!(fnv1a32(b"customer-42"), 0xfe68adbe);
        assert_eq!(key_partition(b"customer-42", 3), 1);
        assert_eq!(key_partition(b"customer-42", 0), 0);
    }
}
