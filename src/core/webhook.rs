//! Webhook authentication (pure): Standard Webhooks signatures and the `X-Gitlab-Token` secret, in constant time.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Signatures older (or newer) than this are refused (replay window).
pub const TOLERANCE_SECS: i64 = 5 * 60;

/// The credentials a delivery carries (header values as received).
#[derive(Debug, Clone, Copy, Default)]
pub struct Presented<'a> {
    pub gitlab_token: Option<&'a str>,
    pub webhook_id: Option<&'a str>,
    pub webhook_timestamp: Option<&'a str>,
    pub webhook_signature: Option<&'a str>,
}

/// What planbot is configured to accept.
#[derive(Clone, Default)]
pub struct Expected {
    pub webhook_secret: Option<String>,
    /// The raw HMAC key, base64-decoded from the `whsec_` token.
    pub signing_key: Option<Vec<u8>>,
}

/// Why a delivery was refused (logged; the client only sees 401).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("no X-Gitlab-Token header")]
    MissingToken,
    #[error("X-Gitlab-Token does not match gitlab.webhook_secret")]
    BadToken,
    #[error("webhook-signature, webhook-id or webhook-timestamp header missing")]
    MissingSignature,
    #[error("delivery is signed but planbot has no gitlab.signing_token to check it")]
    NoSigningKey,
    #[error("webhook-timestamp is not a Unix time")]
    BadTimestamp,
    #[error("webhook-timestamp is more than 5 minutes away from now")]
    Stale,
    #[error("no webhook-signature entry matches")]
    BadSignature,
}

/// Which credential vouched for a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verified {
    Signature,
    Token,
}

/// `whsec_<base64>` → the key bytes; `None` if malformed.
pub fn decode_signing_token(token: &str) -> Option<Vec<u8>> {
    let b64 = token.trim().strip_prefix("whsec_")?;
    let key = STANDARD.decode(b64).ok()?;
    (!key.is_empty()).then_some(key)
}

/// Whether a delivery is to be checked by its signature (one presented, or a signing key
/// configured) rather than by the `X-Gitlab-Token`.
fn signed(p: &Presented<'_>, expected: &Expected) -> bool {
    p.webhook_signature.is_some() || expected.signing_key.is_some()
}

/// Everything that can be checked before one byte of the body is read: the `X-Gitlab-Token`
/// whole (in constant time), or for a signed delivery the key, the three headers, the
/// timestamp's window and the signature's shape. `Ok(Verified::Token)` is final;
/// `Ok(Verified::Signature)` still needs [`verify`] once the body is read. `now` is Unix seconds.
pub fn precheck(p: &Presented<'_>, expected: &Expected, now: i64) -> Result<Verified, Refusal> {
    if signed(p, expected) {
        if expected.signing_key.is_none() {
            return Err(Refusal::NoSigningKey);
        }
        let (Some(_), Some(ts), Some(sig)) =
            (p.webhook_id, p.webhook_timestamp, p.webhook_signature)
        else {
            return Err(Refusal::MissingSignature);
        };
        let ts_num: i64 = ts.trim().parse().map_err(|_| Refusal::BadTimestamp)?;
        // abs_diff: a timestamp near i64::MIN or MAX cannot overflow the subtraction.
        if now.abs_diff(ts_num) > TOLERANCE_SECS.unsigned_abs() {
            return Err(Refusal::Stale);
        }
        // At least one entry that could be an HMAC-SHA256 (`v1,` and 32 bytes of base64).
        let plausible = sig
            .split(' ')
            .filter_map(|e| e.strip_prefix("v1,"))
            .any(|b64| STANDARD.decode(b64).is_ok_and(|b| b.len() == 32));
        return if plausible {
            Ok(Verified::Signature)
        } else {
            Err(Refusal::BadSignature)
        };
    }
    let given = p.gitlab_token.ok_or(Refusal::MissingToken)?;
    let want = expected
        .webhook_secret
        .as_deref()
        .ok_or(Refusal::BadToken)?;
    // Hash both so the comparison's time depends on neither length nor content.
    let g = Sha256::digest(given.as_bytes());
    let w = Sha256::digest(want.as_bytes());
    if bool::from(g.as_slice().ct_eq(w.as_slice())) {
        Ok(Verified::Token)
    } else {
        Err(Refusal::BadToken)
    }
}

/// Verify a delivery: the signature when one is presented or a signing key is configured,
/// else the `X-Gitlab-Token`. `now` is Unix seconds.
pub fn verify(
    p: &Presented<'_>,
    body: &[u8],
    expected: &Expected,
    now: i64,
) -> Result<Verified, Refusal> {
    if precheck(p, expected, now)? == Verified::Token {
        return Ok(Verified::Token);
    }
    let (Some(key), Some(id), Some(ts), Some(sig)) = (
        expected.signing_key.as_deref(),
        p.webhook_id,
        p.webhook_timestamp,
        p.webhook_signature,
    ) else {
        return Err(Refusal::MissingSignature);
    };
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(ts.as_bytes());
    mac.update(b".");
    mac.update(body);
    let want = mac.finalize().into_bytes();
    let mut ok = subtle::Choice::from(0u8);
    for entry in sig.split(' ').filter(|e| !e.is_empty()) {
        let Some(b64) = entry.strip_prefix("v1,") else {
            continue; // other schemes (v1a, …) are not ours
        };
        if let Ok(given) = STANDARD.decode(b64) {
            // Every entry is compared; no early exit on a match.
            ok |= given.as_slice().ct_eq(want.as_slice());
        }
    }
    if bool::from(ok) {
        Ok(Verified::Signature)
    } else {
        Err(Refusal::BadSignature)
    }
}

/// The key a delivery is de-duplicated on. A signed delivery's is its `webhook-id`, which the
/// signature covers (an `Idempotency-Key` is not signed: a replay could change it); else the
/// `Idempotency-Key` (GitLab keeps it across retries and resends), the `webhook-id`, or the
/// body's SHA-256.
pub fn dedup_key(
    verified: Verified,
    p: &Presented<'_>,
    idempotency_key: Option<&str>,
    body: &[u8],
) -> String {
    let signed_id = match verified {
        Verified::Signature => p.webhook_id,
        Verified::Token => None,
    };
    signed_id
        .or(idempotency_key)
        .or(p.webhook_id)
        .map(str::to_string)
        .unwrap_or_else(|| format!("sha256:{}", hex::encode(Sha256::digest(body))))
}

/// Sign a delivery the way GitLab does (`v1,<base64>`), for tests and the load bench.
pub fn sign(key: &[u8], id: &str, timestamp: i64, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(format!("{id}.{timestamp}.").as_bytes());
    mac.update(body);
    format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    fn expected_signing() -> Expected {
        Expected {
            webhook_secret: Some("hook-secret".into()),
            signing_key: decode_signing_token(TOKEN),
        }
    }

    #[test]
    fn standard_webhooks_reference_vector() {
        // The example from the Standard Webhooks specification.
        let key = decode_signing_token(TOKEN).unwrap();
        let body = br#"{"test": 2432232314}"#;
        let sig = sign(&key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body);
        assert_eq!(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn one_matching_entry_among_several_is_enough() {
        let e = expected_signing();
        let body = b"{}";
        let good = sign(e.signing_key.as_ref().unwrap(), "id-1", 1000, body);
        let header = format!("v1,AAAA v1a,whatever {good} v1,bm9wZQ==");
        let p = Presented {
            webhook_id: Some("id-1"),
            webhook_timestamp: Some("1000"),
            webhook_signature: Some(&header),
            ..Default::default()
        };
        assert_eq!(verify(&p, body, &e, 1100), Ok(Verified::Signature));
        assert_eq!(verify(&p, b"{ }", &e, 1100), Err(Refusal::BadSignature));
        assert_eq!(verify(&p, body, &e, 1000 + 301), Err(Refusal::Stale));
        assert_eq!(verify(&p, body, &e, 1000 - 301), Err(Refusal::Stale));
    }

    #[test]
    fn configured_signing_key_makes_the_signature_mandatory() {
        let e = expected_signing();
        let p = Presented {
            gitlab_token: Some("hook-secret"),
            ..Default::default()
        };
        assert_eq!(verify(&p, b"{}", &e, 0), Err(Refusal::MissingSignature));
    }

    #[test]
    fn token_is_compared_exactly() {
        let e = Expected {
            webhook_secret: Some("hook-secret".into()),
            signing_key: None,
        };
        let with = |t: Option<&'static str>| Presented {
            gitlab_token: t,
            ..Default::default()
        };
        assert_eq!(
            verify(&with(Some("hook-secret")), b"", &e, 0),
            Ok(Verified::Token)
        );
        assert_eq!(
            verify(&with(Some("hook-secret ")), b"", &e, 0),
            Err(Refusal::BadToken)
        );
        assert_eq!(verify(&with(Some("")), b"", &e, 0), Err(Refusal::BadToken));
        assert_eq!(verify(&with(None), b"", &e, 0), Err(Refusal::MissingToken));
    }

    #[test]
    fn the_headers_alone_refuse_a_wrong_token_or_a_stale_or_shapeless_signature() {
        let token = Expected {
            webhook_secret: Some("hook-secret".into()),
            signing_key: None,
        };
        let t = |v: &'static str| Presented {
            gitlab_token: Some(v),
            ..Default::default()
        };
        assert_eq!(precheck(&t("hook-secret"), &token, 0), Ok(Verified::Token));
        assert_eq!(precheck(&t("nope"), &token, 0), Err(Refusal::BadToken));
        let e = expected_signing();
        let good = sign(e.signing_key.as_ref().unwrap(), "id-1", 1000, b"{}");
        let s = |sig: &'static str, ts: &'static str| Presented {
            webhook_id: Some("id-1"),
            webhook_timestamp: Some(ts),
            webhook_signature: Some(sig),
            ..Default::default()
        };
        let good: &'static str = Box::leak(good.into_boxed_str());
        assert_eq!(
            precheck(&s(good, "1000"), &e, 1100),
            Ok(Verified::Signature)
        );
        assert_eq!(precheck(&s(good, "1000"), &e, 1301), Err(Refusal::Stale));
        assert_eq!(
            precheck(&s("v1,bm9wZQ==", "1000"), &e, 1000),
            Err(Refusal::BadSignature)
        );
        assert_eq!(
            precheck(&s(good, "soon"), &e, 1000),
            Err(Refusal::BadTimestamp)
        );
    }

    #[test]
    fn a_signed_delivery_is_keyed_on_its_signed_id_whatever_its_idempotency_key() {
        let p = Presented {
            webhook_id: Some("msg-1"),
            ..Default::default()
        };
        assert_eq!(
            dedup_key(Verified::Signature, &p, Some("other"), b""),
            "msg-1"
        );
        assert_eq!(dedup_key(Verified::Token, &p, Some("other"), b""), "other");
        assert_eq!(dedup_key(Verified::Token, &p, None, b""), "msg-1");
        assert!(
            dedup_key(Verified::Token, &Presented::default(), None, b"x").starts_with("sha256:")
        );
    }

    #[test]
    fn malformed_signing_tokens_are_rejected() {
        assert!(decode_signing_token("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").is_none());
        assert!(decode_signing_token("whsec_***").is_none());
        assert!(decode_signing_token("whsec_").is_none());
    }
}
