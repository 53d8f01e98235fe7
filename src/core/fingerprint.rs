//! The plan fingerprint (design §9): HMAC-SHA256 over a canonical projection of what a plan does.

use crate::core::plan::Plan;
use serde::{Deserialize, Serialize};
use std::fmt;

/// 64 lowercase hex characters; shown as its first 12 in notes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Fingerprint(String);

impl Fingerprint {
    /// Compute the fingerprint of `plan` keyed by `key` (the server's fingerprint secret).
    pub fn of(plan: &Plan, key: &[u8]) -> Fingerprint {
        let _ = (plan, key);
        todo!("issue 2 §6: canonical projection + HMAC-SHA256")
    }

    pub fn from_hex(hex: &str) -> Option<Fingerprint> {
        let ok = hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        ok.then(|| Fingerprint(hex.to_string()))
    }

    pub fn as_hex(&self) -> &str {
        &self.0
    }

    /// The first 12 hex characters, as shown in notes.
    pub fn short(&self) -> &str {
        &self.0[..12]
    }

    /// Whether a user-given confirmation (at least 8 hex characters) names this fingerprint.
    pub fn matches_prefix(&self, prefix: &str) -> bool {
        let p = prefix.trim().to_ascii_lowercase();
        p.len() >= 8 && p.len() <= 64 && self.0.starts_with(&p)
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
