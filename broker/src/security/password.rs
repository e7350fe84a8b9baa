//! Password hashing: argon2id, PHC strings, random salt (SPEC §4.1).
//!
//! # Parameters
//!
//! [`HashParams::DEFAULT`] is m = 19 MiB, t = 2, p = 1: the OWASP minimum recommendation for
//! argon2id. On one core of a small broker node that is roughly 20–40 ms and 19 MiB per
//! verification (release build). More would hurt a 2-core broker: verifications run on the
//! blocking pool and, with many users logging in at once, compete with the data path; the
//! verified-credential cache (`authn`) means a keep-alive client pays this once, and the
//! per-username throttle bounds how often an attacker can make us pay it. p = 1 because the
//! node has 2 cores shared with everything else: lanes would not make one verification
//! cheaper in total CPU, only spread it.
//!
//! Verification reads the parameters, salt and algorithm from the stored PHC string, so a
//! hash made with other parameters (e.g. [`HashParams::TEST`], or stronger ones later) still
//! verifies, and comparison of the outputs is constant-time (the `password-hash` crate's
//! `Output` equality). Both calls are CPU-heavy: run them on `spawn_blocking`
//! ([`hash_async`], [`verify_async`]).

use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::{Algorithm, Argon2, Params, Version};
use rand::RngCore;

/// argon2id cost parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HashParams {
    /// Memory in KiB.
    pub m_kib: u32,
    /// Iterations.
    pub t: u32,
    /// Lanes.
    pub p: u32,
}

impl HashParams {
    /// Production: m = 19 MiB, t = 2, p = 1 (OWASP minimum for argon2id).
    pub const DEFAULT: HashParams = HashParams {
        m_kib: 19 * 1024,
        t: 2,
        p: 1,
    };
    /// Tests only: the cheapest argon2 allows (8 KiB, 1 pass). Never for real passwords.
    pub const TEST: HashParams = HashParams {
        m_kib: 8,
        t: 1,
        p: 1,
    };
}

impl Default for HashParams {
    fn default() -> Self {
        HashParams::DEFAULT
    }
}

/// Hashing failed (only on invalid parameters; never because of the password).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("password hashing failed: {0}")]
pub struct PasswordError(String);

/// Hashes `password` with argon2id and a fresh 128-bit random salt; returns the PHC string
/// (`$argon2id$v=19$m=19456,t=2,p=1$<salt>$<hash>`). CPU-heavy: see [`hash_async`].
pub fn hash(password: &str, params: HashParams) -> Result<String, PasswordError> {
    let params = Params::new(params.m_kib, params.t, params.p, None)
        .map_err(|e| PasswordError(e.to_string()))?;
    let argon = Argon2::new(Algorithm::Argon2id, Version::V0x13, params);
    let mut salt = [0u8; 16];
    rand::rng().fill_bytes(&mut salt);
    let salt = SaltString::encode_b64(&salt).map_err(|e| PasswordError(e.to_string()))?;
    argon
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| PasswordError(e.to_string()))
}

/// Whether `password` matches the PHC string `phc` (constant-time comparison; parameters
/// from `phc`). A malformed or non-argon2 `phc` never matches. CPU-heavy: see
/// [`verify_async`].
pub fn verify(password: &str, phc: &str) -> bool {
    let Ok(parsed) = PasswordHash::new(phc) else {
        return false;
    };
    if parsed.algorithm != Algorithm::Argon2id.ident() {
        return false;
    }
    // The verifier takes algorithm, version and params from `parsed`.
    Argon2::default()
        .verify_password(password.as_bytes(), &parsed)
        .is_ok()
}

/// [`hash`] on the blocking pool.
pub async fn hash_async(password: String, params: HashParams) -> Result<String, PasswordError> {
    tokio::task::spawn_blocking(move || hash(&password, params))
        .await
        .map_err(|e| PasswordError(format!("hashing task failed: {e}")))?
}

/// [`verify`] on the blocking pool (a panicked task counts as a mismatch).
pub async fn verify_async(password: String, phc: String) -> bool {
    tokio::task::spawn_blocking(move || verify(&password, &phc))
        .await
        .unwrap_or(false)
}

/// A random 192-bit password (SPEC §4.4, the root password when `NARAD_ADMIN_PASSWORD` is
/// unset): 24 random bytes as 48 lower-case hex digits (safe in shells, URLs and Basic auth).
pub fn generate_password() -> String {
    let mut bytes = [0u8; 24];
    rand::rng().fill_bytes(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// SPEC §3.8: the password must not be empty (`400`).
pub fn validate_password(password: &str) -> Result<(), String> {
    if password.is_empty() {
        return Err("password must not be empty".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_and_verify() {
        let h = hash("s3cret", HashParams::TEST).unwrap();
        assert!(h.starts_with("$argon2id$v=19$m=8,t=1,p=1$"), "{h}");
        assert!(verify("s3cret", &h));
        assert!(!verify("s3cret ", &h));
        assert!(!verify("", &h));
        // Random salt: the same password hashes differently, both verify.
        let h2 = hash("s3cret", HashParams::TEST).unwrap();
        assert_ne!(h, h2);
        assert!(verify("s3cret", &h2));
    }

    #[test]
    fn default_params_are_owasp_minimum() {
        assert_eq!(
            HashParams::default(),
            HashParams {
                m_kib: 19456,
                t: 2,
                p: 1
            }
        );
        // The PHC string carries them (hashing itself is too slow for a unit test in debug).
        let p = Params::new(19456, 2, 1, None).unwrap();
        assert_eq!(p.m_cost(), 19456);
    }

    #[test]
    fn malformed_or_foreign_hashes_never_match() {
        for phc in [
            "",
            "plain",
            "$argon2id$",
            "$argon2i$v=19$m=8,t=1,p=1$c29tZXNhbHQ$aGFzaA",
            "$2b$12$abcdefghijklmnopqrstuuABCDEFGHIJKLMNOPQRSTUVWXYZ01234",
        ] {
            assert!(!verify("x", phc), "{phc}");
        }
        // argon2i of the same password with the same salt does not pass as argon2id.
        let argon = Argon2::new(
            Algorithm::Argon2i,
            Version::V0x13,
            Params::new(8, 1, 1, None).unwrap(),
        );
        let salt = SaltString::encode_b64(b"0123456789abcdef").unwrap();
        let h = argon.hash_password(b"x", &salt).unwrap().to_string();
        assert!(!verify("x", &h));
    }

    #[test]
    fn invalid_params_are_an_error() {
        assert!(hash(
            "x",
            HashParams {
                m_kib: 1,
                t: 0,
                p: 0
            }
        )
        .is_err());
    }

    #[test]
    fn generated_passwords_are_192_bit_hex() {
        let a = generate_password();
        let b = generate_password();
        assert_eq!(a.len(), 48);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[test]
    fn empty_password_is_invalid() {
        assert!(validate_password("").is_err());
        assert!(validate_password(" ").is_ok());
    }

    #[tokio::test]
    async fn async_wrappers() {
        let h = hash_async("pw".into(), HashParams::TEST).await.unwrap();
        assert!(verify_async("pw".into(), h.clone()).await);
        assert!(!verify_async("nope".into(), h).await);
    }
}
