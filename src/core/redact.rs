//! Redaction: collect every secret a plan reveals and scrub them (and their base64 forms) from text.

use crate::core::plan::Plan;
use aho_corasick::{AhoCorasick, MatchKind};
use base64::Engine as _;
use serde_json::Value;
use std::borrow::Cow;
use std::collections::BTreeSet;

/// What replaces a scrubbed secret in any output.
pub const REDACTED: &str = "(sensitive value)";

/// Secrets shorter than this are not scrubbed as free text: a sensitive `true` or `1` would
/// otherwise blank out every such character in the note. They are still hidden by the masks.
pub const MIN_SECRET_LEN: usize = 4;

/// The set of known secret strings.
#[derive(Debug, Clone, Default)]
pub struct Secrets {
    values: BTreeSet<String>,
}

impl Secrets {
    pub fn new() -> Secrets {
        Secrets::default()
    }

    /// Add one secret string (and, at scrub time, its base64 forms).
    pub fn add(&mut self, secret: impl Into<String>) {
        let s = secret.into();
        if s.len() >= MIN_SECRET_LEN {
            self.values.insert(s);
        }
    }

    pub fn extend<I: IntoIterator<Item = S>, S: Into<String>>(&mut self, items: I) {
        for s in items {
            self.add(s);
        }
    }

    /// Every value of a sensitive variable, every value under a `true` mask in resource changes
    /// and drift, and every sensitive output value.
    pub fn from_plan(plan: &Plan) -> Secrets {
        let mut secrets = Secrets::new();
        for v in plan.sensitive_variable_values() {
            secrets.add_value_leaves(v);
        }
        for rc in plan.resource_changes.iter().chain(&plan.resource_drift) {
            secrets.add_masked(&rc.change.before, &rc.change.before_sensitive);
            secrets.add_masked(&rc.change.after, &rc.change.after_sensitive);
        }
        for oc in plan.output_changes.values() {
            if oc.is_sensitive() {
                secrets.add_value_leaves(&oc.before);
                secrets.add_value_leaves(&oc.after);
            }
        }
        secrets
    }

    /// Add every leaf of `value` that `mask` marks sensitive.
    fn add_masked(&mut self, value: &Value, mask: &Value) {
        match (mask, value) {
            (Value::Bool(true), v) => self.add_value_leaves(v),
            (Value::Object(m), Value::Object(v)) => {
                for (k, sub) in m {
                    if let Some(val) = v.get(k) {
                        self.add_masked(val, sub);
                    }
                }
            }
            (Value::Array(m), Value::Array(v)) => {
                for (sub, val) in m.iter().zip(v) {
                    self.add_masked(val, sub);
                }
            }
            _ => {}
        }
    }

    /// Add every scalar inside `value`, and the whole value's JSON when it is composite.
    fn add_value_leaves(&mut self, value: &Value) {
        match value {
            Value::String(s) => {
                self.add(s.clone());
                // Multi-line secrets (keys, certificates) leak line by line too.
                if s.contains('\n') {
                    for line in s.lines() {
                        let line = line.trim();
                        if line.len() >= 8 {
                            self.add(line.to_string());
                        }
                    }
                }
            }
            Value::Number(n) => self.add(n.to_string()),
            Value::Array(items) => items.iter().for_each(|v| self.add_value_leaves(v)),
            Value::Object(map) => map.values().for_each(|v| self.add_value_leaves(v)),
            Value::Bool(_) | Value::Null => {}
        }
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.values.iter().map(String::as_str)
    }

    /// Build the scrubber once; scrub many texts with it.
    pub fn scrubber(&self) -> Scrubber {
        Scrubber::new(self)
    }
}

/// Replaces every known secret (and its base64 encodings) in a text.
#[derive(Debug, Clone)]
pub struct Scrubber {
    matcher: Option<AhoCorasick>,
}

impl Scrubber {
    pub fn new(secrets: &Secrets) -> Scrubber {
        let mut patterns: BTreeSet<String> = BTreeSet::new();
        for s in secrets.iter() {
            patterns.insert(s.to_string());
            for engine in [
                &base64::engine::general_purpose::STANDARD,
                &base64::engine::general_purpose::URL_SAFE,
                &base64::engine::general_purpose::STANDARD_NO_PAD,
            ] {
                let encoded = engine.encode(s.as_bytes());
                if encoded.len() >= MIN_SECRET_LEN {
                    patterns.insert(encoded);
                }
            }
            // A base64 stream of a longer text that contains the secret at any of the three byte
            // alignments: the stable inner part of each encoding.
            for offset in 0..3usize {
                let mut padded = vec![0u8; offset];
                padded.extend_from_slice(s.as_bytes());
                let enc = base64::engine::general_purpose::STANDARD_NO_PAD.encode(&padded);
                // Drop the characters touched by the padding bytes and the trailing partial group.
                let skip = if offset == 0 {
                    0
                } else {
                    (offset * 4).div_ceil(3)
                };
                let total_bits = padded.len() * 8;
                let keep =
                    (total_bits / 6).saturating_sub(if (padded.len() % 3) == 0 { 0 } else { 1 });
                if keep > skip && keep - skip >= 8 {
                    patterns.insert(enc[skip..keep].to_string());
                }
            }
        }
        // JSON-escaped forms (a secret with quotes or newlines inside a JSON text).
        for s in secrets.iter() {
            let escaped = serde_json::to_string(s).unwrap_or_default();
            let inner = escaped.trim_matches('"');
            if inner != s {
                patterns.insert(inner.to_string());
            }
        }
        if patterns.is_empty() {
            return Scrubber { matcher: None };
        }
        let matcher = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(patterns.iter())
            .ok();
        Scrubber { matcher }
    }

    /// A scrubber that knows no secrets (for outputs with nothing to hide).
    pub fn none() -> Scrubber {
        Scrubber { matcher: None }
    }

    pub fn scrub<'a>(&self, text: &'a str) -> Cow<'a, str> {
        match &self.matcher {
            Some(m) if m.is_match(text) => {
                Cow::Owned(m.replace_all(text, &vec![REDACTED; m.patterns_len()]))
            }
            _ => Cow::Borrowed(text),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::engine::general_purpose::STANDARD;

    #[test]
    fn scrubs_plain_and_base64_forms() {
        let mut s = Secrets::new();
        s.add("canary-secret-1234");
        let sc = s.scrubber();
        let text = format!(
            "a canary-secret-1234 b {} c {}",
            STANDARD.encode("canary-secret-1234"),
            STANDARD.encode("prefix: canary-secret-1234 and more")
        );
        let out = sc.scrub(&text);
        assert!(!out.contains("canary-secret-1234"), "{out}");
        assert!(
            !out.contains(&STANDARD.encode("canary-secret-1234")),
            "{out}"
        );
        for offset in 0..3 {
            let long = format!("{}canary-secret-1234 tail", "x".repeat(offset + 5));
            let enc = STANDARD.encode(&long);
            let out = sc.scrub(&enc);
            assert!(out.contains(REDACTED), "offset {offset}: {out}");
        }
    }

    #[test]
    fn collects_values_under_true_masks_at_every_depth() {
        let plan = Plan::from_json(
            br#"{"format_version":"1.2","resource_changes":[{"address":"x.y","mode":"managed",
              "change":{"actions":["create"],
                "after":{"a":"plain-value","b":{"c":"deep-secret"},"l":["l0-open","l1-secret"],"w":{"k":"whole-secret"}},
                "after_sensitive":{"b":{"c":true},"l":[false,true],"w":true}}}]}"#,
        )
        .unwrap();
        let secrets = Secrets::from_plan(&plan);
        let got: Vec<&str> = secrets.iter().collect();
        assert_eq!(got, vec!["deep-secret", "l1-secret", "whole-secret"]);
    }

    #[test]
    fn short_values_are_not_scrubbed_as_text() {
        let mut s = Secrets::new();
        s.add("1");
        s.add("yes");
        assert!(s.is_empty());
    }
}
