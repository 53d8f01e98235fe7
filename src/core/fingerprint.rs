//! The plan fingerprint (design §9): HMAC-SHA256 over a canonical projection of what a plan does.
//!
//! The projection keeps only what applying the plan would do: for every managed change that does
//! something (actions other than `["no-op"]`, or a move, or an import), sorted by `address` and
//! `deposed`, its `actions`, `previous_address`, `importing`, `replace_paths`, the masked `after`
//! and `after_unknown`; plus every root output change that is not a no-op. Timestamps, versions,
//! `before`, prior state, variables and configuration are left out, so two plans of the same
//! code against the same state made at different times have the same fingerprint.
//!
//! Sensitive values (under a `true` mask, sensitive outputs, and any string that contains a
//! secret the plan reveals elsewhere) are replaced by an HMAC of their value: a change of only a
//! sensitive value changes the fingerprint, and the projection never holds the value itself.
//!
//! The projection is encoded canonically: object keys sorted by bytes, every item tagged with its
//! type and every string and collection length-prefixed, so no two projections share an encoding.

use crate::core::plan::{mask_has_true, Plan, ResourceChange};
use crate::core::redact::{Scrubber, Secrets};
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fmt;

type HmacSha256 = Hmac<Sha256>;

/// Version tag mixed into every fingerprint: changing the projection changes this tag.
const DOMAIN: &str = "planbot-fingerprint-v1";
/// Domain of the per-value HMACs that stand in for sensitive values.
const SECRET_DOMAIN: &str = "planbot-sensitive-value-v1";

/// 64 lowercase hex characters; shown as its first 12 in notes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Fingerprint(String);

impl Fingerprint {
    /// Compute the fingerprint of `plan` keyed by `key` (the server's fingerprint secret).
    pub fn of(plan: &Plan, key: &[u8]) -> Fingerprint {
        Fingerprint::of_with_lock(plan, key, None)
    }

    /// Like [`Fingerprint::of`], also binding the root's `.terraform.lock.hcl` (its SHA-256 is
    /// part of the projection): the same plan with other provider pins is another fingerprint.
    /// `None` (no lock file) is distinct from every lock file.
    pub fn of_with_lock(plan: &Plan, key: &[u8], lock_file: Option<&[u8]>) -> Fingerprint {
        let secrets = Secrets::from_plan(plan).scrubber();
        Fingerprint::of_with_secrets(plan, key, lock_file, &secrets)
    }

    /// [`Fingerprint::of_with_lock`] for a caller that already built the scrubber of the plan's
    /// own secrets (`Secrets::from_plan(plan).scrubber()`, nothing added: any other secret would
    /// make another fingerprint of the same plan).
    pub fn of_with_secrets(
        plan: &Plan,
        key: &[u8],
        lock_file: Option<&[u8]>,
        plan_secrets: &Scrubber,
    ) -> Fingerprint {
        let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes keys of any length");
        mac.update(DOMAIN.as_bytes());
        mac.update(b"\0");
        encode_projection(plan, key, lock_file, plan_secrets, &mut |part| {
            mac.update(part.as_bytes())
        });
        Fingerprint(hex::encode(mac.finalize().into_bytes()))
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

    /// Equality in constant time (for comparing a fresh fingerprint with a stored one).
    pub fn ct_eq(&self, other: &Fingerprint) -> bool {
        use subtle::ConstantTimeEq;
        self.0.as_bytes().ct_eq(other.0.as_bytes()).into()
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The canonical projection the fingerprint is computed over, as text (for tests and debugging;
/// it holds no secret: sensitive values appear only as `h64:<hmac>`).
pub fn projection(plan: &Plan, key: &[u8], lock_file: Option<&[u8]>) -> String {
    let secrets = Secrets::from_plan(plan).scrubber();
    let mut out = String::new();
    encode_projection(plan, key, lock_file, &secrets, &mut |part| {
        out.push_str(part)
    });
    out
}

/// Encode the projection piece by piece into `out`, one resource change at a time (their values
/// parsed, projected, encoded and dropped in turn): the same bytes as encoding the projection
/// as one map `{errored, lock_file_sha256, output_changes, resource_changes}` in key order.
fn encode_projection(
    plan: &Plan,
    key: &[u8],
    lock_file: Option<&[u8]>,
    secrets: &Scrubber,
    out: &mut dyn FnMut(&str),
) {
    let hider = Hider { key, secrets };
    let mut buf = String::new();
    let put_key = |buf: &mut String, k: &str| {
        use std::fmt::Write as _;
        let _ = write!(buf, "s{}:{k}", k.len());
    };
    buf.push_str("m4{");
    put_key(&mut buf, "errored");
    Canon::Bool(plan.errored).encode(&mut buf);
    put_key(&mut buf, "lock_file_sha256");
    lock_file
        .map_or(Canon::Null, |b| Canon::Str(hex::encode(Sha256::digest(b))))
        .encode(&mut buf);
    put_key(&mut buf, "output_changes");
    output_projection(plan, &hider).encode(&mut buf);
    put_key(&mut buf, "resource_changes");

    let mut changes: Vec<&ResourceChange> = plan
        .managed_changes()
        .filter(|rc| rc.has_change())
        .collect();
    changes.sort_by(|a, b| {
        (a.address.as_str(), a.deposed.as_deref().unwrap_or(""))
            .cmp(&(b.address.as_str(), b.deposed.as_deref().unwrap_or("")))
    });
    {
        use std::fmt::Write as _;
        let _ = write!(buf, "l{}[", changes.len());
    }
    for rc in changes {
        change_projection(rc, &hider).encode(&mut buf);
        out(&buf);
        buf.clear();
    }
    buf.push_str("]}");
    out(&buf);
}

/// One resource change as projected: what applying it would do, sensitive values hidden.
fn change_projection(rc: &ResourceChange, hider: &Hider) -> Canon {
    let c = &rc.change;
    let v = c.after_values();
    let mut m = BTreeMap::new();
    m.insert("address", Canon::Str(rc.address.clone()));
    m.insert("deposed", opt_str(rc.deposed.as_deref()));
    m.insert(
        "actions",
        Canon::List(c.actions.iter().cloned().map(Canon::Str).collect()),
    );
    m.insert("previous_address", opt_str(rc.previous_address.as_deref()));
    m.insert(
        "importing",
        c.importing.as_ref().map_or(Canon::Null, |v| hider.plain(v)),
    );
    m.insert(
        "replace_paths",
        c.replace_paths.as_ref().map_or(Canon::Null, |paths| {
            Canon::List(
                paths
                    .iter()
                    .map(|p| Canon::List(p.iter().map(|v| hider.plain(v)).collect()))
                    .collect(),
            )
        }),
    );
    m.insert("after", hider.masked(&v.after, &v.after_sensitive));
    m.insert("after_unknown", hider.plain(&v.after_unknown));
    Canon::map(m)
}

/// The root output changes that are not no-ops, as projected.
fn output_projection(plan: &Plan, hider: &Hider) -> Canon {
    let outputs: BTreeMap<String, Canon> = plan
        .output_changes
        .iter()
        .filter(|(_, oc)| oc.kind() != crate::core::plan::ActionKind::NoOp)
        .map(|(name, oc)| {
            let mut m = BTreeMap::new();
            m.insert(
                "actions",
                Canon::List(oc.actions.iter().cloned().map(Canon::Str).collect()),
            );
            let after = if oc.is_sensitive() {
                hider.hide(&oc.after)
            } else {
                hider.masked(&oc.after, &oc.after_sensitive)
            };
            m.insert("after", after);
            m.insert("after_unknown", hider.plain(&oc.after_unknown));
            (name.clone(), Canon::map(m))
        })
        .collect();
    Canon::Map(outputs)
}

fn opt_str(s: Option<&str>) -> Canon {
    s.map_or(Canon::Null, |s| Canon::Str(s.to_string()))
}

/// A projected value. `Hidden` stands in for a sensitive value (its keyed HMAC).
enum Canon {
    Null,
    Bool(bool),
    Num(String),
    Str(String),
    Hidden(String),
    List(Vec<Canon>),
    Map(BTreeMap<String, Canon>),
}

impl Canon {
    fn map(m: BTreeMap<&str, Canon>) -> Canon {
        Canon::Map(m.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
    }

    /// Tagged, length-prefixed encoding: `n`, `t`, `f`, `i<len>:<digits>`, `s<len>:<bytes>`,
    /// `h64:<hex>`, `l<count>[...]`, `m<count>{<s-key><value>...}` with keys in byte order.
    fn encode(&self, out: &mut String) {
        use std::fmt::Write as _;
        match self {
            Canon::Null => out.push('n'),
            Canon::Bool(true) => out.push('t'),
            Canon::Bool(false) => out.push('f'),
            Canon::Num(n) => {
                let _ = write!(out, "i{}:{n}", n.len());
            }
            Canon::Str(s) => {
                let _ = write!(out, "s{}:{s}", s.len());
            }
            Canon::Hidden(h) => {
                let _ = write!(out, "h{}:{h}", h.len());
            }
            Canon::List(items) => {
                let _ = write!(out, "l{}[", items.len());
                for i in items {
                    i.encode(out);
                }
                out.push(']');
            }
            Canon::Map(m) => {
                let _ = write!(out, "m{}{{", m.len());
                for (k, v) in m {
                    let _ = write!(out, "s{}:{k}", k.len());
                    v.encode(out);
                }
                out.push('}');
            }
        }
    }
}

/// Projects values, replacing sensitive ones by their HMAC.
struct Hider<'k> {
    key: &'k [u8],
    /// Every secret string the plan reveals anywhere (masks, sensitive variables and outputs):
    /// masks are incomplete (a computed attribute copying a sensitive input is not marked), so a
    /// plain string containing one of these, in any encoded form, is hidden too.
    secrets: &'k Scrubber,
}

impl<'k> Hider<'k> {
    fn hide(&self, value: &Value) -> Canon {
        let mut plain = String::new();
        self.raw(value).encode(&mut plain);
        let mut mac = HmacSha256::new_from_slice(self.key).expect("HMAC takes keys of any length");
        mac.update(SECRET_DOMAIN.as_bytes());
        mac.update(b"\0");
        mac.update(plain.as_bytes());
        Canon::Hidden(hex::encode(mac.finalize().into_bytes()))
    }

    /// The value as is (only used as input of an HMAC).
    fn raw(&self, value: &Value) -> Canon {
        match value {
            Value::Null => Canon::Null,
            Value::Bool(b) => Canon::Bool(*b),
            Value::Number(n) => Canon::Num(n.to_string()),
            Value::String(s) => Canon::Str(s.clone()),
            Value::Array(items) => Canon::List(items.iter().map(|v| self.raw(v)).collect()),
            Value::Object(m) => {
                Canon::Map(m.iter().map(|(k, v)| (k.clone(), self.raw(v))).collect())
            }
        }
    }

    /// A value with no mask: strings containing a known secret are still hidden.
    fn plain(&self, value: &Value) -> Canon {
        self.masked(value, &Value::Bool(false))
    }

    fn masked(&self, value: &Value, mask: &Value) -> Canon {
        match (mask, value) {
            (Value::Bool(true), v) => self.hide(v),
            (Value::Object(mask), Value::Object(v)) => Canon::Map(
                v.iter()
                    .map(|(k, sub)| {
                        let m = mask.get(k).unwrap_or(&Value::Bool(false));
                        (k.clone(), self.masked(sub, m))
                    })
                    .collect(),
            ),
            (Value::Array(mask), Value::Array(v)) => Canon::List(
                v.iter()
                    .enumerate()
                    .map(|(i, sub)| self.masked(sub, mask.get(i).unwrap_or(&Value::Bool(false))))
                    .collect(),
            ),
            // A mask whose shape does not fit the value: hide the whole value if it marks
            // anything at all.
            (m, v) if mask_has_true(m) => self.hide(v),
            (_, Value::Object(v)) => Canon::Map(
                v.iter()
                    .map(|(k, sub)| (k.clone(), self.plain(sub)))
                    .collect(),
            ),
            (_, Value::Array(v)) => Canon::List(v.iter().map(|sub| self.plain(sub)).collect()),
            (_, Value::String(s)) if self.secrets.is_match(s) => self.hide(value),
            (_, v) => self.raw(v),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(json: &str) -> Plan {
        Plan::from_json(json.as_bytes()).unwrap()
    }

    const BASE: &str = r#"{"format_version":"1.2","timestamp":"T1","terraform_version":"1.11.4",
      "resource_changes":[
        {"address":"b.two","mode":"managed","change":{"actions":["update"],"before":{"x":1},"after":{"x":2,"pw":"s3cret-value"},"after_unknown":{},"after_sensitive":{"pw":true}}},
        {"address":"a.one","mode":"managed","change":{"actions":["create"],"after":{"n":"one"},"after_unknown":{"id":true}}},
        {"address":"c.same","mode":"managed","change":{"actions":["no-op"],"after":{"n":"same"}}},
        {"address":"data.d.x","mode":"data","change":{"actions":["read"],"after":{"n":"d"}}}
      ],
      "output_changes":{"o":{"actions":["create"],"after":"out"},"same":{"actions":["no-op"],"after":"x"}}}"#;

    #[test]
    fn ignores_order_timestamps_versions_before_and_no_ops() {
        let key = b"k";
        let a = Fingerprint::of(&plan(BASE), key);
        let reordered = BASE
            .replace("\"T1\"", "\"T2\"")
            .replace("1.11.4", "1.11.5")
            .replace(r#""before":{"x":1}"#, r#""before":{"x":7}"#)
            .replace(r#"{"n":"same"}"#, r#"{"n":"other"}"#)
            .replace(r#"{"n":"d"}"#, r#"{"n":"e"}"#);
        assert_ne!(reordered, BASE);
        assert_eq!(a, Fingerprint::of(&plan(&reordered), key));
    }

    #[test]
    fn changes_when_what_would_happen_changes() {
        let key = b"k";
        let a = Fingerprint::of(&plan(BASE), key);
        for (from, to) in [
            (r#""x":2"#, r#""x":3"#),
            (r#"["update"]"#, r#"["delete","create"]"#),
            ("a.one", "a.uno"),
            (r#""after":"out""#, r#""after":"put""#),
            ("s3cret-value", "s3cret-valuf"),
            (r#"{"id":true}"#, r#"{}"#),
        ] {
            let other = BASE.replace(from, to);
            assert_ne!(other, BASE);
            assert_ne!(a, Fingerprint::of(&plan(&other), key), "{from} -> {to}");
        }
        assert_ne!(a, Fingerprint::of(&plan(BASE), b"other key"));
        assert_ne!(
            a,
            Fingerprint::of_with_lock(&plan(BASE), key, Some(b"lock"))
        );
        assert_ne!(
            Fingerprint::of_with_lock(&plan(BASE), key, Some(b"lock")),
            Fingerprint::of_with_lock(&plan(BASE), key, Some(b"lock2"))
        );
    }

    #[test]
    fn the_projection_holds_no_sensitive_value() {
        let p = projection(&plan(BASE), b"k", None);
        assert!(!p.contains("s3cret-value"), "{p}");
        assert!(p.contains("s1:x") && p.contains("h64:"), "{p}");
        // Key order is canonical although serde_json keeps insertion order.
        let swapped = BASE.replace(
            r#"{"x":2,"pw":"s3cret-value"}"#,
            r#"{"pw":"s3cret-value","x":2}"#,
        );
        assert_eq!(p, projection(&plan(&swapped), b"k", None));
    }

    #[test]
    fn framing_is_unambiguous() {
        // Two different values whose naive concatenation would be the same.
        let a = plan(
            r#"{"format_version":"1.2","resource_changes":[{"address":"a","mode":"managed","change":{"actions":["create"],"after":{"k":"ab","l":"c"}}}]}"#,
        );
        let b = plan(
            r#"{"format_version":"1.2","resource_changes":[{"address":"a","mode":"managed","change":{"actions":["create"],"after":{"k":"a","l":"bc"}}}]}"#,
        );
        assert_ne!(Fingerprint::of(&a, b"k"), Fingerprint::of(&b, b"k"));
        let n = plan(
            r#"{"format_version":"1.2","resource_changes":[{"address":"a","mode":"managed","change":{"actions":["create"],"after":{"k":"1"}}}]}"#,
        );
        let s = plan(
            r#"{"format_version":"1.2","resource_changes":[{"address":"a","mode":"managed","change":{"actions":["create"],"after":{"k":1}}}]}"#,
        );
        assert_ne!(Fingerprint::of(&n, b"k"), Fingerprint::of(&s, b"k"));
    }

    #[test]
    fn hex_helpers() {
        let f = Fingerprint::of(&plan(BASE), b"k");
        assert_eq!(f.as_hex().len(), 64);
        assert_eq!(Fingerprint::from_hex(f.as_hex()), Some(f.clone()));
        assert!(f.matches_prefix(&f.as_hex()[..8].to_ascii_uppercase()));
        assert!(!f.matches_prefix(&f.as_hex()[..7]));
        assert!(f.ct_eq(&f.clone()));
    }
}
