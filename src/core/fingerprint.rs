//! The plan fingerprint: HMAC-SHA256 over a canonical projection of what a plan does.
//!
//! The projection keeps only what applying the plan would do: for every managed change that does
//! something (actions other than `["no-op"]`, or a move, or an import), sorted by `address` and
//! `deposed`, its `actions`, `previous_address`, `importing`, `replace_paths`, the masked `after`
//! and `after_unknown`; plus every root output change that is not a no-op. Timestamps, versions,
//! `before`, prior state, variables and configuration are left out, so two plans of the same
//! code against the same state made at different times have the same fingerprint. How the apply
//! runs the plan is bound too where it can change what happens: the provider lock file, and the
//! root's `parallelism` (`-parallelism=N`) when it is set.
//!
//! Sensitive values (under a `true` mask, sensitive outputs, and any string that contains a
//! secret the plan reveals elsewhere) are replaced by an HMAC of their value: a change of only a
//! sensitive value changes the fingerprint, and the projection never holds the value itself.
//!
//! The projection is encoded canonically: object keys sorted by bytes, every item tagged with its
//! type and every string and collection length-prefixed, so no two projections share an encoding.

use crate::core::plan::{Json, Plan, ResourceChange};
use crate::core::redact::{Scrubber, Secrets};
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::fmt;
use std::fmt::Write as _;

type HmacSha256 = Hmac<Sha256>;

/// Version tag mixed into every fingerprint: changing the projection changes this tag.
const DOMAIN: &str = "planbot-fingerprint-v1";
/// Domain of the binding of a fingerprint to a plan's targeting (`Fingerprint::with_targeting`).
const TARGETING_DOMAIN: &str = "planbot-targeting-v1";
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
        Fingerprint::of_with_parallelism(plan, key, lock_file, None)
    }

    /// [`Fingerprint::of_with_lock`], also binding the root's `parallelism` (the engine's
    /// `-parallelism=N` for plan and apply): the same plan with another setting is a changed
    /// plan, so an apply refuses a reviewed plan whose setting changed since. `None` (no
    /// setting: the engine's default) is exactly [`Fingerprint::of_with_lock`].
    pub fn of_with_parallelism(
        plan: &Plan,
        key: &[u8],
        lock_file: Option<&[u8]>,
        parallelism: Option<u16>,
    ) -> Fingerprint {
        let secrets = Secrets::from_plan(plan).scrubber();
        Fingerprint::of_with_plan_secrets(plan, key, lock_file, parallelism, &secrets)
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
        Fingerprint::of_with_plan_secrets(plan, key, lock_file, None, plan_secrets)
    }

    /// [`Fingerprint::of_with_parallelism`] for a caller that already built the scrubber of
    /// the plan's own secrets (as [`Fingerprint::of_with_secrets`]; a planned run keeps it from
    /// reading the plan).
    pub fn of_with_plan_secrets(
        plan: &Plan,
        key: &[u8],
        lock_file: Option<&[u8]>,
        parallelism: Option<u16>,
        plan_secrets: &Scrubber,
    ) -> Fingerprint {
        let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes keys of any length");
        mac.update(DOMAIN.as_bytes());
        mac.update(b"\0");
        encode_projection(
            plan,
            key,
            lock_file,
            parallelism,
            plan_secrets,
            &mut |part| mac.update(part.as_bytes()),
        );
        Fingerprint(hex::encode(mac.finalize().into_bytes()))
    }

    /// The fingerprint of a targeted plan (`planbot plan -- -target=…`, `core::targeting`):
    /// the plan's own fingerprint bound, under the same key, to the flags and addresses it was
    /// made with, so that a targeted plan never has the fingerprint of the full plan of the same
    /// changes, nor of another targeting. A full plan (no flag) keeps its fingerprint.
    pub fn with_targeting(
        self,
        key: &[u8],
        targeting: &crate::core::targeting::Targeting,
    ) -> Fingerprint {
        let canonical = targeting.canonical();
        if canonical.is_empty() {
            return self;
        }
        let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes keys of any length");
        mac.update(TARGETING_DOMAIN.as_bytes());
        mac.update(b"\0");
        mac.update(self.0.as_bytes());
        mac.update(b"\0");
        mac.update(canonical.as_bytes());
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
    encode_projection(plan, key, lock_file, None, &secrets, &mut |part| {
        out.push_str(part)
    });
    out
}

/// Encode the projection piece by piece into `out`, one resource change at a time (their values
/// parsed, projected, encoded and dropped in turn): the same bytes as encoding the projection
/// as one map `{errored, lock_file_sha256, output_changes, resource_changes}` in key order
/// (with `parallelism` between `output_changes` and `resource_changes` when it is set, so a
/// plan without the setting keeps the fingerprint it always had).
fn encode_projection(
    plan: &Plan,
    key: &[u8],
    lock_file: Option<&[u8]>,
    parallelism: Option<u16>,
    secrets: &Scrubber,
    out: &mut dyn FnMut(&str),
) {
    let hider = Hider { key, secrets };
    let mut buf = String::new();
    buf.push_str(if parallelism.is_some() { "m5{" } else { "m4{" });
    put_str(&mut buf, "errored");
    buf.push(if plan.errored { 't' } else { 'f' });
    put_str(&mut buf, "lock_file_sha256");
    match lock_file {
        Some(b) => put_str(&mut buf, &hex::encode(Sha256::digest(b))),
        None => buf.push('n'),
    }
    put_str(&mut buf, "output_changes");
    encode_outputs(plan, &hider, &mut buf);
    if let Some(n) = parallelism {
        put_str(&mut buf, "parallelism");
        put_str(&mut buf, &n.to_string());
    }
    put_str(&mut buf, "resource_changes");

    let mut changes: Vec<&ResourceChange> = plan
        .managed_changes()
        .filter(|rc| rc.has_change())
        .collect();
    changes.sort_by(|a, b| {
        (a.address.as_str(), a.deposed.as_deref().unwrap_or(""))
            .cmp(&(b.address.as_str(), b.deposed.as_deref().unwrap_or("")))
    });
    let _ = write!(buf, "l{}[", changes.len());
    for rc in changes {
        encode_change(rc, &hider, &mut buf);
        out(&buf);
        buf.clear();
    }
    buf.push_str("]}");
    out(&buf);
}

/// One resource change as projected (what applying it would do, sensitive values hidden),
/// encoded straight into `out`: the map `{actions, address, after, after_unknown, deposed,
/// importing, previous_address, replace_paths}`, keys in byte order. Its values are parsed
/// once and walked once; nothing of them is copied.
fn encode_change(rc: &ResourceChange, hider: &Hider, out: &mut String) {
    let c = &rc.change;
    let values = c.applied_values();
    let v = values.get();
    let null = Value::Null;
    out.push_str("m8{");
    put_str(out, "actions");
    put_str_list(out, &c.actions);
    put_str(out, "address");
    put_str(out, &rc.address);
    put_str(out, "after");
    hider.write_masked(out, &v.after, Some(&v.after_sensitive));
    put_str(out, "after_unknown");
    hider.write_plain(out, &v.after_unknown);
    put_str(out, "deposed");
    put_opt_str(out, rc.deposed.as_deref());
    put_str(out, "importing");
    hider.write_plain(out, c.importing.as_deref().unwrap_or(&null));
    put_str(out, "previous_address");
    put_opt_str(out, rc.previous_address.as_deref());
    put_str(out, "replace_paths");
    match &c.replace_paths {
        None => out.push('n'),
        Some(paths) => {
            let _ = write!(out, "l{}[", paths.len());
            for path in paths {
                let _ = write!(out, "l{}[", path.len());
                for step in path {
                    hider.write_plain(out, step);
                }
                out.push(']');
            }
            out.push(']');
        }
    }
    out.push('}');
}

/// `s<len>:<bytes>`.
fn put_str(out: &mut String, s: &str) {
    let _ = write!(out, "s{}:", s.len());
    out.push_str(s);
}

/// `l<count>[` then each string, `]`.
fn put_str_list(out: &mut String, items: &[String]) {
    let _ = write!(out, "l{}[", items.len());
    for s in items {
        put_str(out, s);
    }
    out.push(']');
}

fn put_opt_str(out: &mut String, s: Option<&str>) {
    match s {
        Some(s) => put_str(out, s),
        None => out.push('n'),
    }
}

/// The root output changes that are not no-ops, as projected: a map by name of
/// `{actions, after, after_unknown}`, a sensitive output's `after` hidden whole.
fn encode_outputs(plan: &Plan, hider: &Hider, out: &mut String) {
    let outputs: Vec<_> = plan
        .output_changes
        .iter()
        .filter(|(_, oc)| oc.kind() != crate::core::plan::ActionKind::NoOp)
        .collect();
    let _ = write!(out, "m{}{{", outputs.len());
    // By name, in byte order (the map is ordered by name already).
    for (name, oc) in outputs {
        put_str(out, name);
        out.push_str("m3{");
        put_str(out, "actions");
        put_str_list(out, &oc.actions);
        put_str(out, "after");
        if oc.is_sensitive() {
            hider.write_hidden(out, &oc.after);
        } else {
            hider.write_masked(out, &oc.after, Some(&oc.after_sensitive));
        }
        put_str(out, "after_unknown");
        hider.write_plain(out, &oc.after_unknown);
        out.push('}');
    }
    out.push('}');
}

/// A JSON value as the projection reads it: a change's values borrowed from their text
/// ([`Json`]), the outputs and the rest of the document as read whole ([`Value`]). Both give
/// the same shape, so a value encodes the same whichever way it was read.
trait Projected: Sized {
    fn shape(&self) -> Shape<'_, Self>;
}

/// One value's shape: its kind, an object's entries in byte order of their keys (the canonical
/// order), a number as the JSON text `serde_json` writes for it.
enum Shape<'a, V> {
    Null,
    Bool(bool),
    Number(String),
    Str(&'a str),
    List(&'a [V]),
    Map(Vec<(&'a str, &'a V)>),
}

/// `entries` in byte order of their keys (engines write keys sorted already: then one pass).
fn sorted<'a, V>(mut entries: Vec<(&'a str, &'a V)>) -> Vec<(&'a str, &'a V)> {
    if !entries.is_sorted_by(|a, b| a.0 <= b.0) {
        entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
    }
    entries
}

impl Projected for Value {
    fn shape(&self) -> Shape<'_, Value> {
        match self {
            Value::Null => Shape::Null,
            Value::Bool(b) => Shape::Bool(*b),
            Value::Number(n) => Shape::Number(n.to_string()),
            Value::String(s) => Shape::Str(s),
            Value::Array(items) => Shape::List(items),
            Value::Object(m) => {
                Shape::Map(sorted(m.iter().map(|(k, v)| (k.as_str(), v)).collect()))
            }
        }
    }
}

impl Projected for Json<'_> {
    fn shape(&self) -> Shape<'_, Self> {
        match self {
            Json::Null => Shape::Null,
            Json::Bool(b) => Shape::Bool(*b),
            // serde_json's text of the same number (`1.0`, `2.5e-7`, `1e21`).
            Json::Number(n) => Shape::Number(serde_json::to_string(n).unwrap_or_default()),
            Json::Str(s) => Shape::Str(s),
            Json::Array(items) => Shape::List(items),
            Json::Object(m) => Shape::Map(sorted(m.iter().collect())),
        }
    }
}

/// True when a mask marks anything at all as sensitive.
fn marks_anything<V: Projected>(mask: &V) -> bool {
    match mask.shape() {
        Shape::Bool(b) => b,
        Shape::List(items) => items.iter().any(marks_anything),
        Shape::Map(entries) => entries.iter().any(|(_, v)| marks_anything(*v)),
        _ => false,
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
    /// `value` projected through `mask` (`None`: no mask, nothing marked): a value under a
    /// `true` mask (or under a mask whose shape does not fit it but marks something) is hidden
    /// whole; plain strings that contain a known secret are hidden too.
    fn write_masked<V: Projected>(&self, out: &mut String, value: &V, mask: Option<&V>) {
        let Some(mask) = mask else {
            return self.write_plain(out, value);
        };
        match (mask.shape(), value.shape()) {
            (Shape::Bool(true), _) => self.write_hidden(out, value),
            (Shape::Map(mask), Shape::Map(entries)) => {
                let _ = write!(out, "m{}{{", entries.len());
                for (k, sub) in entries {
                    put_str(out, k);
                    let at = mask.binary_search_by(|(m, _)| m.cmp(&k)).ok();
                    self.write_masked(out, sub, at.map(|i| mask[i].1));
                }
                out.push('}');
            }
            (Shape::List(mask), Shape::List(items)) => {
                let _ = write!(out, "l{}[", items.len());
                for (i, sub) in items.iter().enumerate() {
                    self.write_masked(out, sub, mask.get(i));
                }
                out.push(']');
            }
            _ if marks_anything(mask) => self.write_hidden(out, value),
            _ => self.write_plain(out, value),
        }
    }

    /// A value with no mask: strings containing a known secret are still hidden.
    fn write_plain<V: Projected>(&self, out: &mut String, value: &V) {
        match value.shape() {
            Shape::Map(entries) => {
                let _ = write!(out, "m{}{{", entries.len());
                for (k, sub) in entries {
                    put_str(out, k);
                    self.write_plain(out, sub);
                }
                out.push('}');
            }
            Shape::List(items) => {
                let _ = write!(out, "l{}[", items.len());
                for sub in items {
                    self.write_plain(out, sub);
                }
                out.push(']');
            }
            Shape::Str(s) if self.secrets.is_match(s) => self.write_hidden(out, value),
            shape => write_raw_shape(out, shape),
        }
    }

    /// `h64:<hmac>` of the value's raw encoding.
    fn write_hidden<V: Projected>(&self, out: &mut String, value: &V) {
        let mut plain = String::new();
        write_raw(&mut plain, value);
        let mut mac = HmacSha256::new_from_slice(self.key).expect("HMAC takes keys of any length");
        mac.update(SECRET_DOMAIN.as_bytes());
        mac.update(b"\0");
        mac.update(plain.as_bytes());
        out.push_str("h64:");
        out.push_str(&hex::encode(mac.finalize().into_bytes()));
    }
}

/// The value as is, encoded (only used as input of an HMAC, or where nothing is sensitive).
fn write_raw<V: Projected>(out: &mut String, value: &V) {
    write_raw_shape(out, value.shape())
}

fn write_raw_shape<V: Projected>(out: &mut String, shape: Shape<'_, V>) {
    match shape {
        Shape::Null => out.push('n'),
        Shape::Bool(true) => out.push('t'),
        Shape::Bool(false) => out.push('f'),
        Shape::Number(n) => {
            let _ = write!(out, "i{}:{n}", n.len());
        }
        Shape::Str(s) => put_str(out, s),
        Shape::List(items) => {
            let _ = write!(out, "l{}[", items.len());
            for i in items {
                write_raw(out, i);
            }
            out.push(']');
        }
        Shape::Map(entries) => {
            let _ = write!(out, "m{}{{", entries.len());
            for (k, v) in entries {
                put_str(out, k);
                write_raw(out, v);
            }
            out.push('}');
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
    fn a_targeted_plan_is_another_fingerprint_than_the_full_plan_and_than_another_targeting() {
        use crate::core::targeting::Targeting;
        let key = b"k";
        let full = Fingerprint::of(&plan(BASE), key);
        let t = |w: &[&str]| Targeting::parse(w).unwrap();
        let target = full.clone().with_targeting(key, &t(&["-target=a.one"]));
        let exclude = full.clone().with_targeting(key, &t(&["-exclude=a.one"]));
        let replace = full.clone().with_targeting(key, &t(&["-replace=a.one"]));
        assert_eq!(
            full.clone().with_targeting(key, &Targeting::default()),
            full
        );
        for (a, b) in [
            (&full, &target),
            (&full, &exclude),
            (&target, &exclude),
            (&full, &replace),
        ] {
            assert_ne!(a, b);
        }
        // The same targeting written in another order is the same plan.
        assert_eq!(
            full.clone()
                .with_targeting(key, &t(&["-target=a.one", "-target=b.two"])),
            full.clone()
                .with_targeting(key, &t(&["-target=b.two", "-target=a.one"]))
        );
        // Keyed: another key, another fingerprint.
        assert_ne!(
            target,
            full.with_targeting(b"other", &t(&["-target=a.one"]))
        );
    }

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
    fn a_parallelism_setting_is_part_of_the_plan() {
        let (key, lock) = (b"k", Some(&b"lock"[..]));
        let p = plan(BASE);
        let unset = Fingerprint::of_with_lock(&p, key, lock);
        // No setting: the fingerprint every plan had before the setting existed.
        assert_eq!(Fingerprint::of_with_parallelism(&p, key, lock, None), unset);
        let one = Fingerprint::of_with_parallelism(&p, key, lock, Some(1));
        let two = Fingerprint::of_with_parallelism(&p, key, lock, Some(2));
        assert_ne!(one, unset);
        assert_ne!(one, two);
        // The engine's default, said explicitly, is still a setting that was not there.
        assert_ne!(
            Fingerprint::of_with_parallelism(&p, key, lock, Some(10)),
            unset
        );
        assert_eq!(
            one,
            Fingerprint::of_with_parallelism(&p, key, lock, Some(1))
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
    fn the_encoding_is_stable_across_planbot_versions() {
        // Fingerprints are stored when a plan is reviewed and compared at apply time, maybe by a
        // newer planbot: the same plan must keep its fingerprint. This value was computed by the
        // projection of planbot 0.1 (its Canon tree); any change to the encoding must bump DOMAIN.
        let with_outputs = BASE.replace(
            r#""same":{"actions":["no-op"],"after":"x"}"#,
            r#""same":{"actions":["no-op"],"after":"x"},
               "token":{"actions":["update"],"before":"a","after":"hidden-token","after_sensitive":true},
               "conn":{"actions":["create"],"after":{"host":"pve","pw":"p4ss-word","list":[1,2.5,null,true]},"after_sensitive":{"pw":true},"after_unknown":{"id":true}}"#,
        );
        let p = plan(&with_outputs);
        assert_eq!(p.output_changes.len(), 4);
        assert_eq!(
            Fingerprint::of_with_lock(&p, b"k", Some(b"lock")).as_hex(),
            "d6b39ce63bf1ca80a10164cb16bd191e9ac5aa6b5bd66e0bdaca63e2c5478d0e"
        );
    }

    #[test]
    fn the_encoding_of_every_kind_of_value_in_a_change_is_stable() {
        // As above, for the values of resource changes: numbers written every way the engine
        // may (`1.0` is a float, not the integer 1), keys and strings with escapes, nesting,
        // masks below the top level, an import. This value was computed by the projection that
        // read the values into `serde_json::Value` (planbot 0.2); reading them another way must
        // not change it.
        let p = plan(
            r#"{"format_version":"1.2","resource_changes":[
              {"address":"t.n","mode":"managed","change":{"actions":["update"],
                "before":{"f":1.5},
                "after":{"one":1.0,"tiny":2.5e-7,"huge":1e21,"max":18446744073709551615,"neg":-3,
                         "a\"b":"x\ny","\u003ctag\u003e":"\u0026","ключ":"значение\t",
                         "disk":[{"size":32,"pw":"disk-secret"},{"size":8.0,"pw":null}],
                         "empty":[[],{}],"z":null,"b":true},
                "after_unknown":{"disk":[{"id":true},{}],"later":true},
                "after_sensitive":{"disk":[{"pw":true},{"pw":true}],"a\"b":true}}},
              {"address":"t.i","mode":"managed","change":{"actions":["no-op"],"after":{"id":"x"},
                "importing":{"id":"100"}}}
            ]}"#,
        );
        assert_eq!(
            Fingerprint::of(&p, b"k").as_hex(),
            "55aa3cbf0bbe7dd3c1447735c88c2c886cd0facc0ccd0fb8111d1ff8a7b43331"
        );
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

    /// A mask shaped like `value`: each leaf marked or not, some keys and items left out, now
    /// and then a whole container marked, or a mask of another shape.
    fn random_mask(value: &Value, next: &mut dyn FnMut(u64) -> u64) -> Value {
        match (next(10), value) {
            (0, _) => Value::Bool(true),
            (1, _) => serde_json::json!([true]),
            (_, Value::Object(m)) => {
                let mut mask = serde_json::Map::new();
                for (k, v) in m {
                    if next(4) != 0 {
                        mask.insert(k.clone(), random_mask(v, next));
                    }
                }
                Value::Object(mask)
            }
            (_, Value::Array(items)) => Value::Array(
                items
                    .iter()
                    .take(next(items.len() as u64 + 1) as usize)
                    .map(|v| random_mask(v, next))
                    .collect(),
            ),
            _ => Value::Bool(next(3) == 0),
        }
    }

    #[test]
    fn random_values_project_the_same_read_borrowed_as_read_whole() {
        let mut next = crate::core::plan::tests::seeded(0xf1a9);
        let mut secrets = Secrets::new();
        secrets.add("ключ");
        secrets.add("a\"a\\");
        let secrets = secrets.scrubber();
        let hider = Hider {
            key: b"k",
            secrets: &secrets,
        };
        let (mut hidden_by_masks, mut hidden_by_secrets) = (0, 0);
        for round in 0..400 {
            let value: Value = (0..6)
                .map(|i| {
                    let v = crate::core::plan::tests::random_value(&mut next, 4);
                    (format!("k{i}"), v)
                })
                .collect::<serde_json::Map<_, _>>()
                .into();
            let mask = random_mask(&value, &mut next);
            let (text, mask_text) = (value.to_string(), mask.to_string());
            let borrowed: Json = serde_json::from_str(&text).unwrap();
            let borrowed_mask: Json = serde_json::from_str(&mask_text).unwrap();
            let (mut whole, mut read) = (String::new(), String::new());
            hider.write_masked(&mut whole, &value, Some(&mask));
            hider.write_masked(&mut read, &borrowed, Some(&borrowed_mask));
            assert_eq!(read, whole, "round {round}: {text} under {mask_text}");
            hidden_by_masks += whole.matches("h64:").count();
            let (mut whole, mut read) = (String::new(), String::new());
            hider.write_plain(&mut whole, &value);
            hider.write_plain(&mut read, &borrowed);
            assert_eq!(read, whole, "round {round}: {text}");
            hidden_by_secrets += whole.matches("h64:").count();
        }
        // The rounds hid values, by their masks and by the secrets, not only wrote them.
        assert!(
            hidden_by_masks > 400 && hidden_by_secrets > 50,
            "{hidden_by_masks} {hidden_by_secrets}"
        );
    }
}
