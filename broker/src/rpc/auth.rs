//! Node-to-node authentication on the cluster port (SPEC §4.5): a challenge–response on
//! every new connection, before any other frame.
//!
//! 1. Server → client `AuthChallenge`: a fresh random 32-byte nonce ‖ the server's node id.
//! 2. Client → server `AuthResponse`: its node id and
//!    `HMAC-SHA256(secret, "narad-cluster-auth-v1" ‖ nonce ‖ node id)`.
//! 3. Server: verifies the proof in constant time (`hmac`'s `verify_slice`). Good → `AuthOk`
//!    and requests may flow; bad → an `Error` frame (`authentication failed`, nothing more)
//!    and the connection is closed. The client must answer within [`HANDSHAKE_TIMEOUT`].
//!
//! The client also checks the node id in the challenge against the node it meant to reach,
//! so a stale address that now belongs to another node is noticed rather than silently used.
//! (This is not server authentication: only the client proves knowledge of the secret. The
//! cluster network must be private, or use mutual TLS; SPEC §4.5.)
//!
//! **Which secret.** A node proves and checks the configured `NARAD_CLUSTER_SECRET` (at least
//! [`MIN_SECRET_LEN`] bytes; the config layer enforces it). A standalone node without one uses
//! a random secret made at start ([`ClusterSecret::random`]) that nobody else knows, so its
//! cluster port serves no one. Only a cluster with security off and no secret configured uses
//! the empty secret (everyone may do everything over HTTP there anyway): such a server marks
//! its callers unproven ([`ClusterSecret::proves_identity`] is false), and the node-RPC handler
//! refuses every request from an unproven caller whenever security is on, as a second line.
//!
//! Secrets and proofs are never logged, never put in error messages and never `Debug`-printed
//! ([`ClusterSecret`]'s `Debug` is redacted).

use std::fmt;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::Sha256;

/// Domain-separation prefix of the proof (SPEC §4.5).
pub const AUTH_CONTEXT: &[u8] = b"narad-cluster-auth-v1";
/// Nonce length in the challenge.
pub const NONCE_LEN: usize = 32;
/// HMAC-SHA256 output length.
pub const PROOF_LEN: usize = 32;
/// Longest node id accepted on the wire (bytes).
pub const MAX_NODE_ID_LEN: usize = 255;
/// Shortest cluster secret accepted (bytes): 256 bits, as the HMAC key.
pub const MIN_SECRET_LEN: usize = 32;
/// How long either side waits for the other's handshake frame.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// The only message a refused client is told (nothing about why).
pub const AUTH_FAILED: &str = "authentication failed";

type HmacSha256 = Hmac<Sha256>;

/// The shared cluster secret (`NARAD_CLUSTER_SECRET`). Empty = no secret (see module doc).
#[derive(Clone, Default)]
pub struct ClusterSecret(Bytes);

impl ClusterSecret {
    pub fn new(secret: impl Into<Bytes>) -> ClusterSecret {
        ClusterSecret(secret.into())
    }

    /// The empty secret (security off / none configured).
    pub fn none() -> ClusterSecret {
        ClusterSecret(Bytes::new())
    }

    /// A fresh random secret that exists only in this process (a standalone node's).
    pub fn random() -> ClusterSecret {
        let mut key = [0u8; MIN_SECRET_LEN];
        rand::rng().fill_bytes(&mut key);
        ClusterSecret(Bytes::copy_from_slice(&key))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether a proof with this secret shows the caller knows something others do not: false
    /// for the empty secret, which anyone can prove.
    pub fn proves_identity(&self) -> bool {
        !self.0.is_empty()
    }

    fn mac(&self, nonce: &[u8; NONCE_LEN], node_id: &str, binding: &[u8]) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.0)
            .expect("invariant: HMAC accepts keys of any length");
        mac.update(AUTH_CONTEXT);
        mac.update(nonce);
        mac.update(node_id.as_bytes());
        mac.update(binding);
        mac
    }

    /// `HMAC-SHA256(secret, "narad-cluster-auth-v1" ‖ nonce ‖ node id)` on plaintext.
    pub fn proof(&self, nonce: &[u8; NONCE_LEN], node_id: &str) -> [u8; PROOF_LEN] {
        self.bound_proof(nonce, node_id, &[])
    }

    /// The proof bound to a TLS session: `… ‖ node id ‖ binding`, where `binding` is the
    /// session's exported keying material (empty on plaintext; see `transport`).
    pub fn bound_proof(
        &self,
        nonce: &[u8; NONCE_LEN],
        node_id: &str,
        binding: &[u8],
    ) -> [u8; PROOF_LEN] {
        self.mac(nonce, node_id, binding)
            .finalize()
            .into_bytes()
            .into()
    }

    /// Constant-time check of a client's plaintext proof.
    pub fn verify(&self, nonce: &[u8; NONCE_LEN], node_id: &str, proof: &[u8]) -> bool {
        self.verify_bound(nonce, node_id, &[], proof)
    }

    /// Constant-time check of a proof bound to `binding` (see [`ClusterSecret::bound_proof`]).
    pub fn verify_bound(
        &self,
        nonce: &[u8; NONCE_LEN],
        node_id: &str,
        binding: &[u8],
        proof: &[u8],
    ) -> bool {
        self.mac(nonce, node_id, binding)
            .verify_slice(proof)
            .is_ok()
    }
}

impl fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            f.write_str("ClusterSecret(none)")
        } else {
            f.write_str("ClusterSecret(<redacted>)")
        }
    }
}

/// A fresh nonce from the thread-local CSPRNG (ChaCha, seeded from the OS).
pub fn new_nonce() -> [u8; NONCE_LEN] {
    let mut nonce = [0u8; NONCE_LEN];
    rand::rng().fill_bytes(&mut nonce);
    nonce
}

/// Why a handshake payload did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthParseError {
    #[error("malformed auth challenge")]
    Challenge,
    #[error("malformed auth response")]
    Response,
    #[error("invalid node id")]
    NodeId,
}

fn check_node_id(id: &str) -> Result<(), AuthParseError> {
    if id.is_empty() || id.len() > MAX_NODE_ID_LEN || id.chars().any(char::is_control) {
        return Err(AuthParseError::NodeId);
    }
    Ok(())
}

/// `AuthChallenge` payload: nonce ‖ server node id.
pub fn encode_challenge(nonce: &[u8; NONCE_LEN], server_id: &str) -> Bytes {
    let mut b = BytesMut::with_capacity(NONCE_LEN + server_id.len());
    b.put_slice(nonce);
    b.put_slice(server_id.as_bytes());
    b.freeze()
}

pub fn decode_challenge(payload: &[u8]) -> Result<([u8; NONCE_LEN], String), AuthParseError> {
    if payload.len() < NONCE_LEN {
        return Err(AuthParseError::Challenge);
    }
    let nonce: [u8; NONCE_LEN] = payload[..NONCE_LEN].try_into().expect("32 bytes");
    let id = std::str::from_utf8(&payload[NONCE_LEN..]).map_err(|_| AuthParseError::Challenge)?;
    check_node_id(id)?;
    Ok((nonce, id.to_owned()))
}

/// `AuthResponse` payload: u16 id length ‖ node id ‖ proof.
pub fn encode_response(node_id: &str, proof: &[u8; PROOF_LEN]) -> Bytes {
    let mut b = BytesMut::with_capacity(2 + node_id.len() + PROOF_LEN);
    b.put_u16(node_id.len() as u16);
    b.put_slice(node_id.as_bytes());
    b.put_slice(proof);
    b.freeze()
}

pub fn decode_response(payload: &[u8]) -> Result<(String, [u8; PROOF_LEN]), AuthParseError> {
    if payload.len() < 2 {
        return Err(AuthParseError::Response);
    }
    let len = usize::from(u16::from_be_bytes([payload[0], payload[1]]));
    if payload.len() != 2 + len + PROOF_LEN {
        return Err(AuthParseError::Response);
    }
    let id = std::str::from_utf8(&payload[2..2 + len]).map_err(|_| AuthParseError::Response)?;
    check_node_id(id)?;
    let proof: [u8; PROOF_LEN] = payload[2 + len..].try_into().expect("32 bytes");
    Ok((id.to_owned(), proof))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proof_is_hmac_sha256_of_context_nonce_and_id() {
        // RFC 4231 test case 2 shape: key "Jefe", checked against an independent computation
        // of the same construction (HMAC over the concatenation).
        let secret = ClusterSecret::new(&b"Jefe"[..]);
        let nonce = [7u8; NONCE_LEN];
        let mut mac = HmacSha256::new_from_slice(b"Jefe").unwrap();
        let mut msg = AUTH_CONTEXT.to_vec();
        msg.extend_from_slice(&nonce);
        msg.extend_from_slice(b"narad-1");
        mac.update(&msg);
        let expected: [u8; 32] = mac.finalize().into_bytes().into();
        assert_eq!(secret.proof(&nonce, "narad-1"), expected);
        // Known-answer: RFC 4231 case 2 validates the primitive itself.
        let mut mac = HmacSha256::new_from_slice(b"Jefe").unwrap();
        mac.update(b"what do ya want for nothing?");
        let kat: [u8; 32] = mac.finalize().into_bytes().into();
        assert_eq!(
            kat.iter().map(|b| format!("{b:02x}")).collect::<String>(),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn verify_accepts_only_the_right_secret_nonce_and_id() {
        let s = ClusterSecret::new("s3cret");
        let nonce = new_nonce();
        let p = s.proof(&nonce, "a");
        assert!(s.verify(&nonce, "a", &p));
        assert!(!ClusterSecret::new("other").verify(&nonce, "a", &p));
        assert!(!ClusterSecret::none().verify(&nonce, "a", &p));
        assert!(!s.verify(&nonce, "b", &p));
        assert!(!s.verify(&new_nonce(), "a", &p));
        assert!(!s.verify(&nonce, "a", &p[..31]));
        let mut flipped = p;
        flipped[31] ^= 1;
        assert!(!s.verify(&nonce, "a", &flipped));
        // The empty secret is a well-defined key too.
        let none = ClusterSecret::none();
        assert!(none.verify(&nonce, "a", &none.proof(&nonce, "a")));
        assert_ne!(new_nonce(), new_nonce());
    }

    #[test]
    fn secret_is_never_debug_printed() {
        let s = ClusterSecret::new("hunter2");
        assert_eq!(format!("{s:?}"), "ClusterSecret(<redacted>)");
        assert_eq!(
            format!("{:?}", ClusterSecret::none()),
            "ClusterSecret(none)"
        );
        assert_eq!(
            format!("{:?}", ClusterSecret::random()),
            "ClusterSecret(<redacted>)"
        );
    }

    #[test]
    fn random_secrets_prove_identity_and_differ() {
        let (a, b) = (ClusterSecret::random(), ClusterSecret::random());
        assert!(a.proves_identity() && b.proves_identity());
        assert!(!ClusterSecret::none().proves_identity());
        let nonce = new_nonce();
        assert!(!b.verify(&nonce, "x", &a.proof(&nonce, "x")));
        assert!(!a.verify(&nonce, "x", &ClusterSecret::none().proof(&nonce, "x")));
    }

    #[test]
    fn handshake_payloads_round_trip_and_reject_garbage() {
        let nonce = new_nonce();
        let c = encode_challenge(&nonce, "narad-0");
        assert_eq!(decode_challenge(&c).unwrap(), (nonce, "narad-0".to_owned()));
        assert!(decode_challenge(&c[..NONCE_LEN]).is_err());
        assert!(decode_challenge(&c[..10]).is_err());

        let proof = [9u8; PROOF_LEN];
        let r = encode_response("narad-2", &proof);
        assert_eq!(decode_response(&r).unwrap(), ("narad-2".to_owned(), proof));
        for cut in 0..r.len() {
            assert!(decode_response(&r[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = r.to_vec();
        long.push(0);
        assert!(decode_response(&long).is_err());
        assert!(decode_response(&encode_response("", &proof)).is_err());
        assert!(decode_response(&encode_response("a\nb", &proof)).is_err());
        assert!(decode_response(&encode_response(&"x".repeat(256), &proof)).is_err());
    }
}

#[cfg(test)]
mod prop_tests {
    use super::*;
    use proptest::collection::vec;
    use proptest::prelude::*;

    /// Node ids the handshake accepts: 1 to 255 bytes of UTF-8 without control characters.
    fn node_id() -> impl Strategy<Value = String> {
        prop_oneof!["[a-z0-9-]{1,64}", "\\PC{1,64}"]
            .prop_filter("at most 255 bytes", |s| s.len() <= MAX_NODE_ID_LEN)
    }

    fn valid_id(id: &str) -> bool {
        !id.is_empty() && id.len() <= MAX_NODE_ID_LEN && !id.chars().any(char::is_control)
    }

    proptest! {
        #[test]
        fn prop_challenge_roundtrip(nonce in any::<[u8; NONCE_LEN]>(), id in node_id()) {
            let c = encode_challenge(&nonce, &id);
            prop_assert_eq!(decode_challenge(&c).unwrap(), (nonce, id));
        }

        /// Arbitrary challenges: what decodes has a valid id and re-encodes to the same bytes.
        #[test]
        fn prop_decode_challenge_arbitrary(b in vec(any::<u8>(), 0..320)) {
            if let Ok((nonce, id)) = decode_challenge(&b) {
                prop_assert!(valid_id(&id));
                prop_assert_eq!(&encode_challenge(&nonce, &id)[..], &b[..]);
            }
        }

        #[test]
        fn prop_response_roundtrip_and_truncation(
            id in node_id(),
            proof in any::<[u8; PROOF_LEN]>(),
            cut in any::<prop::sample::Index>(),
            extra in vec(any::<u8>(), 1..4),
        ) {
            let r = encode_response(&id, &proof);
            prop_assert_eq!(decode_response(&r).unwrap(), (id, proof));
            prop_assert!(decode_response(&r[..cut.index(r.len())]).is_err());
            let mut longer = r.to_vec();
            longer.extend(extra);
            prop_assert!(decode_response(&longer).is_err());
        }

        #[test]
        fn prop_decode_response_arbitrary(b in vec(any::<u8>(), 0..320)) {
            if let Ok((id, proof)) = decode_response(&b) {
                prop_assert!(valid_id(&id));
                prop_assert_eq!(&encode_response(&id, &proof)[..], &b[..]);
            }
        }

        /// A length prefix that is off, or an id that is not a valid node id (empty, too
        /// long, control characters), is refused; anything else is accepted.
        #[test]
        fn prop_decode_response_checks_length_and_id(
            id in prop_oneof![node_id(), any::<String>(), "\\PC{0,8}\\pC\\PC{0,8}", "x{250,260}"],
            fudge in prop_oneof![3 => Just(0i32), 1 => -2..=2i32],
            proof in any::<[u8; PROOF_LEN]>(),
        ) {
            let len = (id.len() as i32 + fudge).clamp(0, u16::MAX as i32) as u16;
            let mut b = len.to_be_bytes().to_vec();
            b.extend_from_slice(id.as_bytes());
            b.extend_from_slice(&proof);
            let ok = usize::from(len) == id.len() && valid_id(&id);
            prop_assert_eq!(decode_response(&b).ok(), ok.then(|| (id.clone(), proof)));
        }
    }
}
