//! What crosses the store but must not be readable there: sealed with AES-256-GCM under a key
//! derived from `fingerprint_key` (never stored), compressed first. A root unit's result travels
//! this way from the replica that planned the root to the plan job that writes the note.

use aes_gcm::aead::{Aead, KeyInit};
use aes_gcm::{Aes256Gcm, Nonce};
use base64::Engine as _;
use hmac::{Hmac, Mac};

/// The most a sealed text opens to: the plan documents inside are bounded far lower.
pub const MAX_OPENED: usize = 256 * 1024 * 1024;

/// The key of one purpose, derived from a secret that never leaves the configuration.
pub struct SealKey(Aes256Gcm);

/// Why a sealed text does not open.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Unsealed {
    #[error("it is not a sealed text")]
    Malformed,
    #[error("it was not sealed with this key, or it was changed")]
    Forged,
    #[error("it opens to more than {MAX_OPENED} bytes")]
    TooLarge,
}

impl SealKey {
    /// The key for `purpose`, from `secret` (HMAC-SHA256: one secret, many unrelated keys).
    pub fn derive(secret: &[u8], purpose: &str) -> SealKey {
        let mut mac =
            <Hmac<sha2::Sha256> as Mac>::new_from_slice(secret).expect("HMAC takes any key");
        mac.update(b"planbot: sealed across the store, v1: ");
        mac.update(purpose.as_bytes());
        let key = mac.finalize().into_bytes();
        SealKey(Aes256Gcm::new(&key))
    }

    /// `plain`, compressed and sealed with `nonce` (never used twice with one key: the caller
    /// draws it at random), as base64 text.
    pub fn seal(&self, plain: &[u8], nonce: [u8; 12]) -> String {
        let packed = lz4_flex::compress_prepend_size(plain);
        let sealed = self
            .0
            .encrypt(Nonce::from_slice(&nonce), packed.as_slice())
            .expect("AES-GCM seals any text under 64 GiB");
        let mut out = nonce.to_vec();
        out.extend(sealed);
        base64::engine::general_purpose::STANDARD.encode(out)
    }

    /// What [`SealKey::seal`] sealed, when it was sealed with this key and not changed since.
    pub fn open(&self, sealed: &str) -> Result<Vec<u8>, Unsealed> {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(sealed)
            .map_err(|_| Unsealed::Malformed)?;
        if bytes.len() < 12 + 16 {
            return Err(Unsealed::Malformed);
        }
        let (nonce, sealed) = bytes.split_at(12);
        let packed = self
            .0
            .decrypt(Nonce::from_slice(nonce), sealed)
            .map_err(|_| Unsealed::Forged)?;
        let size = packed
            .get(..4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
            .ok_or(Unsealed::Malformed)?;
        if size > MAX_OPENED {
            return Err(Unsealed::TooLarge);
        }
        lz4_flex::decompress_size_prepended(&packed).map_err(|_| Unsealed::Malformed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_text_opens_with_its_key_only_and_holds_nothing_readable() {
        let key = SealKey::derive(b"fingerprint key", "root units");
        let plain = br#"{"password":"hunter2-hunter2-hunter2"}"#.repeat(50);
        let sealed = key.seal(&plain, [7; 12]);
        assert!(!sealed.contains("hunter2"));
        let raw = base64::engine::general_purpose::STANDARD
            .decode(&sealed)
            .unwrap();
        assert!(!raw.windows(7).any(|w| w == b"hunter2"));
        assert_eq!(key.open(&sealed).unwrap(), plain);
        let other = SealKey::derive(b"another key", "root units");
        assert_eq!(other.open(&sealed), Err(Unsealed::Forged));
        let purpose = SealKey::derive(b"fingerprint key", "something else");
        assert_eq!(purpose.open(&sealed), Err(Unsealed::Forged));
        let mut changed = raw.clone();
        let last = changed.len() - 1;
        changed[last] ^= 1;
        let changed = base64::engine::general_purpose::STANDARD.encode(changed);
        assert_eq!(key.open(&changed), Err(Unsealed::Forged));
        assert_eq!(key.open("not base64 !"), Err(Unsealed::Malformed));
        assert_eq!(key.open("AAAA"), Err(Unsealed::Malformed));
    }
}
