//! Remote-child credentials at rest (issue 12 finding 12): a link's password is sealed by
//! the node that accepts the attach, before it is proposed, so the Raft log, snapshots and
//! `metastore/raft.redb` only ever hold ciphertext; the owners of the parent's partitions
//! open it when they build the link's client.
//!
//! **Key.** With a cluster secret (`NARAD_CLUSTER_SECRET`, which every member shares), the
//! key is derived from it: HMAC-SHA256(secret, [`KEY_LABEL`]). A standalone node without a
//! secret keeps a random key in `<data_dir>/credentials.key` (32 bytes, mode 0600, made on
//! first start). A node whose key cannot open a stored value (the secret was changed) reports
//! it on the link (`last_error`) and sends nothing; attaching the link again seals it anew.
//!
//! **Format.** `narad-sealed:v1:` + base64(nonce ‖ ChaCha20-Poly1305(password)), with the
//! parent and link names as associated data, so a sealed value moved to another link does not
//! open. A stored value without the prefix is a password written by an older build and is used
//! as it is.

use std::io::{Read, Write};
use std::path::Path;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use hmac::{Hmac, Mac};
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};
use sha2::Sha256;

/// What the key is derived for (changing it makes every sealed value unreadable).
pub const KEY_LABEL: &[u8] = b"narad remote-child credentials v1";
/// The prefix of a sealed value.
pub const SEALED_PREFIX: &str = "narad-sealed:v1:";
/// The key file of a standalone node without a cluster secret.
pub const KEY_FILE: &str = "credentials.key";
const KEY_LEN: usize = 32;

/// Why a stored credential could not be opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    #[error("the stored credentials are damaged")]
    Malformed,
    #[error("the stored credentials do not open with this node's key (was the cluster secret changed? attach the link again)")]
    WrongKey,
}

/// The key that seals and opens remote-child passwords.
pub struct CredentialKey {
    key: LessSafeKey,
}

impl std::fmt::Debug for CredentialKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CredentialKey(..)")
    }
}

impl CredentialKey {
    fn from_bytes(bytes: &[u8; KEY_LEN]) -> CredentialKey {
        let unbound = UnboundKey::new(&CHACHA20_POLY1305, bytes)
            .expect("invariant: a 32-byte ChaCha20-Poly1305 key");
        CredentialKey {
            key: LessSafeKey::new(unbound),
        }
    }

    /// The key every member derives from the shared cluster secret.
    pub fn from_secret(secret: &[u8]) -> CredentialKey {
        let mut mac =
            Hmac::<Sha256>::new_from_slice(secret).expect("invariant: HMAC takes any key");
        mac.update(KEY_LABEL);
        let bytes: [u8; KEY_LEN] = mac.finalize().into_bytes().into();
        CredentialKey::from_bytes(&bytes)
    }

    /// The key in `dir/credentials.key`, made (random, 0600, fsynced) if it does not exist.
    pub fn from_key_file(dir: &Path) -> anyhow::Result<CredentialKey> {
        use anyhow::Context;
        use std::os::unix::fs::OpenOptionsExt;
        let path = dir.join(KEY_FILE);
        let mut bytes = [0u8; KEY_LEN];
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
        {
            Ok(mut f) => {
                SystemRandom::new()
                    .fill(&mut bytes)
                    .map_err(|_| anyhow::anyhow!("no randomness for {}", path.display()))?;
                f.write_all(&bytes)
                    .and_then(|()| f.sync_all())
                    .with_context(|| format!("write {}", path.display()))?;
                std::fs::File::open(dir)
                    .and_then(|d| d.sync_all())
                    .with_context(|| format!("sync {}", dir.display()))?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let mut f = std::fs::File::open(&path)
                    .with_context(|| format!("open {}", path.display()))?;
                let mut all = Vec::new();
                f.read_to_end(&mut all)
                    .with_context(|| format!("read {}", path.display()))?;
                if all.len() != KEY_LEN {
                    anyhow::bail!(
                        "{} holds {} bytes, not a {KEY_LEN}-byte key",
                        path.display(),
                        all.len()
                    );
                }
                bytes.copy_from_slice(&all);
            }
            Err(e) => return Err(e).with_context(|| format!("create {}", path.display())),
        }
        Ok(CredentialKey::from_bytes(&bytes))
    }

    fn aad(parent: &str, link: &str) -> Vec<u8> {
        let mut aad = Vec::with_capacity(parent.len() + link.len() + 1);
        aad.extend_from_slice(parent.as_bytes());
        aad.push(0);
        aad.extend_from_slice(link.as_bytes());
        aad
    }

    /// Seals the password of link `link` of topic `parent`.
    pub fn seal(&self, parent: &str, link: &str, password: &str) -> String {
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new()
            .fill(&mut nonce)
            .expect("invariant: the system has randomness");
        let mut buf = password.as_bytes().to_vec();
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(Self::aad(parent, link)),
                &mut buf,
            )
            .expect("invariant: a password fits one ChaCha20-Poly1305 message");
        let mut out = nonce.to_vec();
        out.extend_from_slice(&buf);
        format!("{SEALED_PREFIX}{}", B64.encode(out))
    }

    /// Opens a stored password with `key`, this node's key if it seals (`None`: a node that
    /// seals nothing, which can only use values stored as given).
    pub fn open_stored(
        key: Option<&CredentialKey>,
        parent: &str,
        link: &str,
        stored: &str,
    ) -> Result<String, SealError> {
        match key {
            Some(k) => k.open(parent, link, stored),
            None if stored.starts_with(SEALED_PREFIX) => Err(SealError::WrongKey),
            None => Ok(stored.to_string()),
        }
    }

    /// Opens a stored password (one without the sealed prefix is used as it is).
    pub fn open(&self, parent: &str, link: &str, stored: &str) -> Result<String, SealError> {
        let Some(b64) = stored.strip_prefix(SEALED_PREFIX) else {
            return Ok(stored.to_string());
        };
        let raw = B64.decode(b64).map_err(|_| SealError::Malformed)?;
        if raw.len() < NONCE_LEN + CHACHA20_POLY1305.tag_len() {
            return Err(SealError::Malformed);
        }
        let (nonce, sealed) = raw.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| SealError::Malformed)?;
        let mut buf = sealed.to_vec();
        let plain = self
            .key
            .open_in_place(nonce, Aad::from(Self::aad(parent, link)), &mut buf)
            .map_err(|_| SealError::WrongKey)?;
        String::from_utf8(plain.to_vec()).map_err(|_| SealError::Malformed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seals_and_opens_bound_to_the_link() {
        let k = CredentialKey::from_secret(b"a-cluster-secret-of-32-bytes-or-more!!");
        let s = k.seal("orders", "dr", "s3cret-pw");
        assert!(s.starts_with(SEALED_PREFIX));
        assert!(!s.contains("s3cret"));
        // Random nonce: the same password seals differently each time.
        assert_ne!(s, k.seal("orders", "dr", "s3cret-pw"));
        assert_eq!(k.open("orders", "dr", &s).unwrap(), "s3cret-pw");
        // The same secret on another member opens it; another link or secret does not.
        let same = CredentialKey::from_secret(b"a-cluster-secret-of-32-bytes-or-more!!");
        assert_eq!(same.open("orders", "dr", &s).unwrap(), "s3cret-pw");
        assert_eq!(k.open("orders", "dr2", &s), Err(SealError::WrongKey));
        let other = CredentialKey::from_secret(b"another-cluster-secret-of-32-bytes!!!");
        assert_eq!(other.open("orders", "dr", &s), Err(SealError::WrongKey));
        // Tampering and damage are refused; an old plaintext value passes.
        let mut raw = B64.decode(&s[SEALED_PREFIX.len()..]).unwrap();
        *raw.last_mut().unwrap() ^= 1;
        let tampered = format!("{SEALED_PREFIX}{}", B64.encode(raw));
        assert_eq!(k.open("orders", "dr", &tampered), Err(SealError::WrongKey));
        assert_eq!(
            k.open("orders", "dr", &format!("{SEALED_PREFIX}!!")),
            Err(SealError::Malformed)
        );
        assert_eq!(
            k.open("orders", "dr", &format!("{SEALED_PREFIX}AAAA")),
            Err(SealError::Malformed)
        );
        assert_eq!(k.open("orders", "dr", "legacy-pw").unwrap(), "legacy-pw");
        assert_eq!(k.open("o", "d", &k.seal("o", "d", "")).unwrap(), "");
        // A node without a key uses plain values and cannot open sealed ones.
        assert_eq!(
            CredentialKey::open_stored(None, "o", "d", "pw").unwrap(),
            "pw"
        );
        assert_eq!(
            CredentialKey::open_stored(None, "orders", "dr", &s),
            Err(SealError::WrongKey)
        );
        assert_eq!(
            CredentialKey::open_stored(Some(&k), "orders", "dr", &s).unwrap(),
            "s3cret-pw"
        );
    }

    #[test]
    fn the_key_file_is_made_once_private_and_reused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let a = CredentialKey::from_key_file(dir.path()).unwrap();
        let path = dir.path().join(KEY_FILE);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let s = a.seal("p", "l", "pw");
        let b = CredentialKey::from_key_file(dir.path()).unwrap();
        assert_eq!(b.open("p", "l", &s).unwrap(), "pw");
        std::fs::write(&path, b"short").unwrap();
        let e = CredentialKey::from_key_file(dir.path()).unwrap_err();
        assert!(e.to_string().contains("not a 32-byte key"), "{e}");
    }
}
