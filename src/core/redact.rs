//! Redaction: collect every secret a plan reveals and scrub them (and their encoded forms) from text.
//!
//! Masks are honoured at every depth (objects, lists, sets, whole values), but masks are
//! incomplete (a computed attribute copying a sensitive input is not marked once stored), so
//! every text that leaves the process is also scrubbed of every known secret string, in each form
//! it may take on the way: as is, JSON-escaped (also Go's HTML-safe `\u003c` escapes, which the
//! engine's `show -json` uses), HTML-escaped, URL-encoded, and base64 (standard and URL-safe,
//! padded or not, and inside a longer base64 text at any of the three byte alignments).

use crate::core::plan::{for_each_leaf, for_each_masked_leaf, ConfigModule, Plan};
use aho_corasick::{AhoCorasick, MatchKind};
use base64::Engine as _;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::hash::Hasher as _;
use std::sync::Arc;

/// What replaces a scrubbed secret in any output.
pub const REDACTED: &str = "(sensitive value)";

/// Secrets shorter than this are not scrubbed as free text: a sensitive `true` or `1` would
/// otherwise blank out every such character in the note. They are still hidden by the masks.
pub const MIN_SECRET_LEN: usize = 4;

/// A base64 fragment shorter than this (a secret inside a longer base64 text) is not scrubbed:
/// too many unrelated base64 texts would contain it by chance.
const MIN_FRAGMENT_LEN: usize = 8;

/// Lines of a multi-line secret at least this long are secrets on their own (a log may show
/// them one per line, with other indentation).
const MIN_LINE_LEN: usize = 8;

/// Parts of an environment variable's name that make its value a secret (compared without
/// regard to case): `TF_HTTP_PASSWORD`, `PROXMOX_VE_API_TOKEN`, `AWS_SECRET_ACCESS_KEY`,
/// `TF_VAR_db_passphrase`, `GOOGLE_CREDENTIALS`… A user name, an address or a lock method is
/// not a secret, and scrubbing it would only blank out words ("planbot", "main") everywhere.
pub const SECRET_NAME_PARTS: &[&str] = &[
    "PASS",
    "TOKEN",
    "SECRET",
    "KEY",
    "CREDENTIAL",
    "PRIVATE",
    "AUTH",
];

/// Variables whose value is a secret although their name does not say so: OpenTofu's
/// encryption configuration holds the state passphrase.
pub const SECRET_NAMES: &[&str] = &["TF_ENCRYPTION"];

/// Whether the value of the environment variable `name` is a secret by its name (see
/// [`SECRET_NAME_PARTS`] and [`SECRET_NAMES`]); an operator lists any other one explicitly.
pub fn is_secret_name(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    SECRET_NAMES.contains(&upper.as_str()) || SECRET_NAME_PARTS.iter().any(|p| upper.contains(p))
}

/// The set of known secret strings, and the keyed digests of secrets known only by them.
#[derive(Debug, Clone, Default)]
pub struct Secrets {
    values: BTreeSet<String>,
    digested: Option<Arc<Digested>>,
}

/// The key of [`SecretDigests`]: 128 bits of HMAC-SHA256 of planbot's fingerprint key, so a
/// digest is of no use to whoever does not hold that key (and the key itself is never kept
/// with a digest).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct DigestKey([u8; 16]);

impl std::fmt::Debug for DigestKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DigestKey(..)")
    }
}

impl DigestKey {
    /// The digests' key of planbot's fingerprint key `key`.
    pub fn derive(key: &[u8]) -> DigestKey {
        let mut mac = Hmac::<sha2::Sha256>::new_from_slice(key).expect("HMAC takes any key");
        mac.update(b"planbot: the digests of a kept plan's secrets, v1");
        let out = mac.finalize().into_bytes();
        let mut k = [0u8; 16];
        k.copy_from_slice(&out[..16]);
        DigestKey(k)
    }

    /// The keyed digest (SipHash-1-3, a PRF under the key) of `bytes`.
    pub fn digest(&self, bytes: &[u8]) -> u64 {
        let mut h = siphasher::sip::SipHasher13::new_with_key(&self.0);
        h.write(bytes);
        h.finish()
    }
}

/// Every form ([`Scrubber`]'s patterns) of a set of secrets, each as its length and keyed
/// digest: what a plan kept outside the process that made it holds of its secrets, so that the
/// note it is shown in again is still scrubbed of them wherever another root's plan shows
/// them, without any secret ever being written down. A text is searched by digesting each of
/// its windows of each length.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretDigests {
    /// Pattern length in bytes → the sorted digests of the patterns of that length.
    by_len: BTreeMap<usize, Vec<u64>>,
    /// The sorted digests of every pattern's first four bytes: a window is digested whole only
    /// where one of them starts (one digest per byte of text, not one per byte and length).
    starts: Vec<u64>,
}

impl SecretDigests {
    pub fn is_empty(&self) -> bool {
        self.by_len.is_empty()
    }

    fn merge(&mut self, other: &SecretDigests) {
        for (len, digests) in &other.by_len {
            let mine = self.by_len.entry(*len).or_default();
            mine.extend(digests);
            mine.sort_unstable();
            mine.dedup();
        }
        self.starts.extend(&other.starts);
        self.starts.sort_unstable();
        self.starts.dedup();
    }
}

/// Digests known under one key.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Digested {
    key: DigestKey,
    digests: SecretDigests,
}

impl Digested {
    /// Every window of `text` whose digest is one of a pattern of its length, as a span.
    fn spans(&self, text: &str, spans: &mut Vec<(usize, usize)>) {
        let bytes = text.as_bytes();
        let starts = &self.digests.starts;
        for start in 0..bytes.len().saturating_sub(3) {
            let first = self.key.digest(&bytes[start..start + 4]);
            if starts.binary_search(&first).is_err() {
                continue;
            }
            for (&len, digests) in &self.digests.by_len {
                let end = start + len;
                if end > bytes.len() {
                    break;
                }
                if digests
                    .binary_search(&self.key.digest(&bytes[start..end]))
                    .is_ok()
                    && text.is_char_boundary(start)
                    && text.is_char_boundary(end)
                {
                    spans.push((start, end));
                }
            }
        }
    }
}

impl Secrets {
    pub fn new() -> Secrets {
        Secrets::default()
    }

    /// Add one secret string (and, at scrub time, its encoded forms). A secret with surrounding
    /// whitespace (a file read with `file()`) is also added trimmed, and the lines of a
    /// multi-line secret (keys, certificates) are added one by one.
    pub fn add(&mut self, secret: impl Into<String>) {
        let s = secret.into();
        if s.contains('\n') {
            for line in s.lines() {
                let line = line.trim();
                if line.len() >= MIN_LINE_LEN {
                    self.values.insert(line.to_string());
                }
            }
        }
        let trimmed = s.trim();
        if trimmed.len() != s.len() && trimmed.len() >= MIN_SECRET_LEN {
            self.values.insert(trimmed.to_string());
        }
        if s.len() >= MIN_SECRET_LEN {
            self.values.insert(s);
        }
    }

    pub fn extend<I: IntoIterator<Item = S>, S: Into<String>>(&mut self, items: I) {
        for s in items {
            self.add(s);
        }
    }

    /// Add every secret of `other`.
    pub fn merge(&mut self, other: &Secrets) {
        self.values.extend(other.values.iter().cloned());
        if let Some(d) = &other.digested {
            self.add_digests(d.key, &d.digests);
        }
    }

    /// Every form of every secret known in clear, as digests under `key`.
    pub fn digests(&self, key: DigestKey) -> SecretDigests {
        let mut digests = SecretDigests::default();
        let mut forms = BTreeSet::new();
        for s in &self.values {
            forms_of(s, &mut forms);
        }
        for form in forms {
            let digest = key.digest(form.as_bytes());
            digests.by_len.entry(form.len()).or_default().push(digest);
            // Every form is at least MIN_SECRET_LEN (4) bytes long.
            digests.starts.push(key.digest(&form.as_bytes()[..4]));
        }
        digests.starts.sort_unstable();
        digests.starts.dedup();
        for d in digests.by_len.values_mut() {
            d.sort_unstable();
            d.dedup();
        }
        if let Some(d) = &self.digested {
            if d.key == key {
                digests.merge(&d.digests);
            }
        }
        digests
    }

    /// Secrets known only by their digests under `key` ([`SecretDigests`]): the scrubber
    /// searches for them too. Digests under a second key are not kept (one planbot has one).
    pub fn add_digests(&mut self, key: DigestKey, digests: &SecretDigests) {
        if digests.is_empty() {
            return;
        }
        let mut merged = match self.digested.take() {
            Some(d) if d.key != key => {
                self.digested = Some(d);
                return;
            }
            Some(d) => Arc::unwrap_or_clone(d).digests,
            None => SecretDigests::default(),
        };
        merged.merge(digests);
        self.digested = Some(Arc::new(Digested {
            key,
            digests: merged,
        }));
    }

    /// Every value of a sensitive variable (and every default of a variable declared sensitive,
    /// in the root and in child modules), every value under a `true` mask in resource changes,
    /// drift, prior state and planned values, and every sensitive output value.
    pub fn from_plan(plan: &Plan) -> Secrets {
        let mut secrets = Secrets::new();
        for v in plan.sensitive_variable_values() {
            secrets.add_value_leaves(v);
        }
        if let Some(cfg) = &plan.configuration {
            secrets.add_sensitive_defaults(&cfg.root_module);
        }
        for rc in plan.resource_changes.iter().chain(&plan.resource_drift) {
            // One resource's values at a time; most resources have no sensitive value at all,
            // and then only their (small) masks are parsed, else only what the masks mark.
            rc.change.for_each_sensitive_leaf(&mut |s| secrets.add(s));
        }
        for oc in plan.output_changes.values() {
            if oc.is_sensitive() {
                secrets.add_value_leaves(&oc.before);
                secrets.add_value_leaves(&oc.after);
            } else {
                secrets.add_masked(&oc.before, &oc.before_sensitive);
                secrets.add_masked(&oc.after, &oc.after_sensitive);
            }
        }
        secrets.extend(plan.prior_state_secrets.0.iter().cloned());
        secrets.extend(plan.planned_values_secrets.0.iter().cloned());
        secrets
    }

    fn add_sensitive_defaults(&mut self, module: &ConfigModule) {
        for var in module.variables.values() {
            if var.sensitive {
                if let Some(default) = &var.default {
                    self.add_value_leaves(default);
                }
            }
        }
        for call in module.module_calls.values() {
            self.add_sensitive_defaults(&call.module);
        }
    }

    /// Add every leaf of `value` that `mask` marks sensitive.
    fn add_masked(&mut self, value: &Value, mask: &Value) {
        for_each_masked_leaf(value, mask, &mut |s| self.add(s));
    }

    /// Add every scalar inside `value` (object keys are not secrets; their values are).
    fn add_value_leaves(&mut self, value: &Value) {
        for_each_leaf(value, &mut |s| self.add(s));
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty() && self.digested.is_none()
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

/// Pattern bytes per automaton. Building an automaton holds about forty bytes per pattern byte
/// until it is compacted (to about six): a plan with thousands of secrets (a password per VM)
/// gets several automata, so that building them never holds much more than the result.
const CHUNK_BYTES: usize = 64 * 1024;

/// Replaces every known secret (and its encoded forms) in a text.
///
/// Every occurrence of every pattern is found, overlapping ones included, and each run of
/// overlapping occurrences is replaced as one: no part of a secret that overlaps another is
/// left in clear.
#[derive(Debug, Clone)]
pub struct Scrubber {
    /// The patterns, a few secrets' forms per automaton, each automaton built the first time a
    /// text may hold one of its patterns: most texts hold none, and building the automata of
    /// thousands of secrets took an eighth of their plan's `planbot render`.
    chunks: Arc<[Chunk]>,
    /// The first four bytes of every pattern, with its chunk: a text none of whose four-byte
    /// windows is one holds no secret, and is passed on without running any automaton over it
    /// (the automata of thousands of secrets cost tens of nanoseconds a byte); one that has
    /// some is searched by the automata of those windows' chunks only.
    starts: Arc<Starts>,
    /// The secrets known only by their digests (a kept plan's, [`SecretDigests`]).
    digested: Option<Arc<Digested>>,
}

/// The patterns of one automaton, and the automaton once a text needed it.
struct Chunk {
    /// The patterns until the automaton is built from them (then dropped).
    patterns: std::sync::Mutex<Vec<String>>,
    matcher: std::sync::OnceLock<AhoCorasick>,
}

impl std::fmt::Debug for Chunk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the patterns: they are secrets.
        write!(f, "Chunk(built: {})", self.matcher.get().is_some())
    }
}

impl Chunk {
    fn new(mut patterns: Vec<String>) -> Chunk {
        patterns.sort_unstable();
        patterns.dedup();
        patterns.shrink_to_fit();
        Chunk {
            patterns: std::sync::Mutex::new(patterns),
            matcher: std::sync::OnceLock::new(),
        }
    }

    /// The automaton, built from the patterns the first time it is asked for.
    fn matcher(&self) -> &AhoCorasick {
        self.matcher.get_or_init(|| {
            let patterns = std::mem::take(
                &mut *self
                    .patterns
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner),
            );
            AhoCorasick::builder()
                .match_kind(MatchKind::Standard)
                .build(patterns)
                .expect("secret patterns are plain strings")
        })
    }
}

/// The four-byte starts of a scrubber's patterns (every pattern is at least
/// [`MIN_SECRET_LEN`] bytes long), each with the chunk that holds its pattern: a bit per hash
/// for a quick no, then the exact set.
#[derive(Default)]
struct Starts {
    bits: Vec<u64>,
    /// (start, chunk), sorted.
    exact: Vec<(u32, u32)>,
}

// A pattern shorter than a window would pass unseen by [`Starts`].
const _: () = assert!(MIN_SECRET_LEN >= 4 && MIN_FRAGMENT_LEN >= 4);

impl std::fmt::Debug for Starts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the starts themselves: they are the first bytes of secrets.
        write!(f, "Starts({})", self.exact.len())
    }
}

/// log2 of the bits of [`Starts`] (32 KiB: a few percent of them set by 10,000 secrets).
const START_BITS: u32 = 18;

impl Starts {
    fn hash(key: u32) -> usize {
        (key.wrapping_mul(0x9E37_79B1) >> (32 - START_BITS)) as usize
    }

    fn build(mut exact: Vec<(u32, u32)>) -> Starts {
        exact.sort_unstable();
        exact.dedup();
        exact.shrink_to_fit();
        let mut bits = vec![0u64; 1 << (START_BITS - 6)];
        for &(key, _) in &exact {
            let h = Starts::hash(key);
            bits[h >> 6] |= 1 << (h & 63);
        }
        Starts { bits, exact }
    }

    /// The chunks whose patterns start at one of `text`'s four-byte windows, in order (none:
    /// `text` holds no pattern). A pattern found in `text` starts at one of its windows, so
    /// these chunks' automata find every pattern it holds.
    fn chunks_in(&self, text: &[u8]) -> Vec<usize> {
        let mut chunks = Vec::new();
        for w in text.windows(4) {
            let key = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
            let h = Starts::hash(key);
            if self.bits[h >> 6] & (1 << (h & 63)) == 0 {
                continue;
            }
            let from = self.exact.partition_point(|&(k, _)| k < key);
            for &(_, chunk) in self.exact[from..].iter().take_while(|&&(k, _)| k == key) {
                // A secret's windows repeat in a long text: each chunk once in a row.
                if chunks.last() != Some(&(chunk as usize)) {
                    chunks.push(chunk as usize);
                }
            }
        }
        chunks.sort_unstable();
        chunks.dedup();
        chunks
    }
}

impl crate::core::templates::Scrub for Scrubber {
    fn is_empty(&self) -> bool {
        Scrubber::is_empty(self)
    }

    fn scrub<'a>(&self, text: &'a str) -> Cow<'a, str> {
        Scrubber::scrub(self, text)
    }
}

impl Scrubber {
    pub fn new(secrets: &Secrets) -> Scrubber {
        // The forms of a few secrets per chunk: the patterns of one automaton are all that is
        // held besides the automata already built when one is built.
        let mut chunks = Vec::new();
        let mut chunk: Vec<String> = Vec::new();
        let mut bytes = 0;
        let mut forms = BTreeSet::new();
        let mut starts = Vec::new();
        for s in secrets.iter() {
            forms_of(s, &mut forms);
            for form in std::mem::take(&mut forms) {
                bytes += form.len();
                // Every form is at least MIN_SECRET_LEN (4) bytes long.
                let b = form.as_bytes();
                let at = u32::try_from(chunks.len()).expect("fewer than 2^32 chunks");
                starts.push((u32::from_le_bytes([b[0], b[1], b[2], b[3]]), at));
                chunk.push(form);
            }
            if bytes >= CHUNK_BYTES {
                chunks.push(Chunk::new(std::mem::take(&mut chunk)));
                bytes = 0;
            }
        }
        if !chunk.is_empty() {
            chunks.push(Chunk::new(chunk));
        }
        Scrubber {
            chunks: chunks.into(),
            starts: Arc::new(Starts::build(starts)),
            digested: secrets.digested.clone(),
        }
    }

    /// A scrubber that knows no secrets (for outputs with nothing to hide).
    pub fn none() -> Scrubber {
        Scrubber {
            chunks: Arc::new([]),
            starts: Arc::default(),
            digested: None,
        }
    }

    /// Whether this scrubber knows no secret at all.
    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty() && self.digested.is_none()
    }

    /// Whether `text` holds any known secret, in any of its forms.
    pub fn is_match(&self, text: &str) -> bool {
        if let Some(d) = &self.digested {
            let mut spans = Vec::new();
            d.spans(text, &mut spans);
            if !spans.is_empty() {
                return true;
            }
        }
        self.chunks_in(text)
            .into_iter()
            .any(|c| self.chunks[c].matcher().is_match(text))
    }

    /// The chunks whose patterns may be in `text` (secrets known in clear): none when no
    /// pattern can start anywhere in it.
    fn chunks_in(&self, text: &str) -> Vec<usize> {
        if self.chunks.is_empty() {
            return Vec::new();
        }
        self.starts.chunks_in(text.as_bytes())
    }

    pub fn scrub<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let mut spans: Vec<(usize, usize)> = Vec::new();
        if let Some(d) = &self.digested {
            d.spans(text, &mut spans);
        }
        let chunks = self.chunks_in(text);
        if spans.is_empty() && chunks.is_empty() {
            return Cow::Borrowed(text);
        }
        for c in chunks {
            spans.extend(
                self.chunks[c]
                    .matcher()
                    .find_overlapping_iter(text)
                    .map(|found| (found.start(), found.end())),
            );
        }
        if spans.is_empty() {
            return Cow::Borrowed(text);
        }
        spans.sort_unstable();
        let mut out = String::with_capacity(text.len());
        let mut copied = 0;
        let mut spans = spans.into_iter().peekable();
        while let Some((start, mut end)) = spans.next() {
            // Join every occurrence that overlaps this run.
            while let Some(&(next_start, next_end)) = spans.peek() {
                if next_start >= end {
                    break;
                }
                end = end.max(next_end);
                spans.next();
            }
            // Patterns and text are UTF-8, so occurrences start and end on char boundaries.
            out.push_str(&text[copied..start]);
            out.push_str(REDACTED);
            copied = end;
        }
        out.push_str(&text[copied..]);
        Cow::Owned(out)
    }

    /// Scrub raw process output (invalid UTF-8 is replaced first).
    pub fn scrub_bytes(&self, bytes: &[u8]) -> String {
        let text = String::from_utf8_lossy(bytes);
        self.scrub(&text).into_owned()
    }

    /// `value` as pretty JSON indented by `indent`, every string and key in it scrubbed
    /// ([`Scrubber::scrub_json`]): every JSON that planbot prints goes through here. Scrubbing
    /// JSON's text instead would also hit its `false`, `null` and numbers (a sensitive value
    /// `false` made `"errored": (sensitive value)`), and the output would not be JSON.
    pub fn pretty_json(&self, value: &impl serde::Serialize, indent: &[u8]) -> String {
        let value = serde_json::to_value(value).expect("planbot's reports serialize");
        let mut out = Vec::new();
        let formatter = serde_json::ser::PrettyFormatter::with_indent(indent);
        let mut ser = serde_json::Serializer::with_formatter(&mut out, formatter);
        serde::Serialize::serialize(&self.scrub_json(&value), &mut ser)
            .expect("a JSON value serializes");
        String::from_utf8(out).expect("JSON is UTF-8")
    }

    /// Scrub every string (and object key) inside a JSON value, so the result stays valid JSON
    /// whatever the secret contains.
    pub fn scrub_json(&self, value: &Value) -> Value {
        match value {
            Value::String(s) => Value::String(self.scrub(s).into_owned()),
            Value::Array(items) => Value::Array(items.iter().map(|v| self.scrub_json(v)).collect()),
            Value::Object(map) => Value::Object(
                map.iter()
                    .map(|(k, v)| (self.scrub(k).into_owned(), self.scrub_json(v)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }
}

/// Every pattern of secret `s` the scrubber searches for: its text forms and base64 forms at
/// least [`MIN_SECRET_LEN`] long.
fn forms_of(s: &str, forms: &mut BTreeSet<String>) {
    for form in text_forms(s) {
        if form.len() >= MIN_SECRET_LEN {
            forms.insert(form);
        }
    }
    base64_forms(s.as_bytes(), forms);
}

/// The textual forms a secret can take in JSON, HTML, URLs and logs.
fn text_forms(s: &str) -> Vec<String> {
    let mut forms = vec![s.to_string()];
    // Letters, digits and `-._` are the same in every one of these encodings (most generated
    // passwords and tokens): nothing else to build.
    if s.bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
    {
        return forms;
    }
    // JSON string escapes (serde_json style: `\"`, `\\`, `\n`, `\u001b`).
    if let Ok(json) = serde_json::to_string(s) {
        let inner = json[1..json.len() - 1].to_string();
        // Go's encoding/json (the engine's `show -json`) also escapes `<`, `>`, `&`, U+2028/9.
        let go = inner
            .replace('<', "\\u003c")
            .replace('>', "\\u003e")
            .replace('&', "\\u0026")
            .replace('\u{2028}', "\\u2028")
            .replace('\u{2029}', "\\u2029");
        forms.push(inner);
        forms.push(go);
    }
    // HTML escapes (a renderer may escape a value shown in HTML or Markdown).
    let html = s
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;");
    forms.push(html.replace('\'', "&#39;"));
    forms.push(html.replace('\'', "&#x27;"));
    // Markdown prose and table cells (`core::markdown`): links, mentions and autolinks
    // broken, `|` as an entity.
    let prose = crate::core::markdown::prose_escape(s);
    forms.push(prose.replace('|', "&#124;"));
    forms.push(prose);
    // URL encodings: form-style (space = `+`) and RFC 3986 percent-encoding, both hex cases.
    forms.push(url::form_urlencoded::byte_serialize(s.as_bytes()).collect());
    let pct = percent_encode(s);
    forms.push(pct.to_ascii_lowercase_hex());
    forms.push(pct);
    forms.dedup();
    forms
}

/// RFC 3986 percent-encoding of everything but the unreserved characters (upper-case hex).
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

trait LowerHex {
    fn to_ascii_lowercase_hex(&self) -> String;
}

impl LowerHex for String {
    /// `%2F` → `%2f`, leaving the other characters as they are.
    fn to_ascii_lowercase_hex(&self) -> String {
        let mut out = String::with_capacity(self.len());
        let mut chars = self.chars();
        while let Some(c) = chars.next() {
            out.push(c);
            if c == '%' {
                for h in chars.by_ref().take(2) {
                    out.push(h.to_ascii_lowercase());
                }
            }
        }
        out
    }
}

/// Base64 encodings of `bytes`: whole (padded and not, standard and URL-safe alphabets), and
/// the stable inner part of its encoding when it sits inside a longer text at each of the three
/// byte alignments.
fn base64_forms(bytes: &[u8], patterns: &mut BTreeSet<String>) {
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
    for engine in [&STANDARD, &URL_SAFE] {
        let encoded = engine.encode(bytes);
        if encoded.len() >= MIN_SECRET_LEN {
            patterns.insert(encoded);
        }
    }
    for engine in [&STANDARD_NO_PAD, &URL_SAFE_NO_PAD] {
        for offset in 0..3usize {
            let mut padded = vec![0u8; offset];
            padded.extend_from_slice(bytes);
            let enc = engine.encode(&padded);
            // Character i covers bits [6i, 6i+6): it depends only on the secret when those bits
            // start at or after the `offset` foreign bytes and end within the secret.
            let first = (offset * 8).div_ceil(6);
            let end = (padded.len() * 8) / 6;
            if end >= first + MIN_FRAGMENT_LEN {
                patterns.insert(enc[first..end].to_string());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};

    fn scrubber(secrets: &[&str]) -> Scrubber {
        let mut s = Secrets::new();
        s.extend(secrets.iter().copied());
        s.scrubber()
    }

    #[test]
    fn a_text_where_no_secret_can_start_is_passed_on_unsearched() {
        let sc = scrubber(&["hunter2-secret", "c0ffee-token"]);
        // None holds a secret (the last starts like one, and is searched): borrowed as is.
        for text in [
            "",
            "abc",
            "vm-1 on pve01, 2 cores",
            "hunter2 alone is no secret",
        ] {
            assert!(matches!(sc.scrub(text), Cow::Borrowed(_)), "{text}");
            assert!(!sc.is_match(text), "{text}");
        }
        // A secret at the very end, at the very start, and whole.
        assert_eq!(sc.scrub("x=hunter2-secret"), format!("x={REDACTED}"));
        assert_eq!(sc.scrub("c0ffee-token!"), format!("{REDACTED}!"));
        assert_eq!(sc.scrub("hunter2-secret"), REDACTED);
        assert!(sc.is_match("a c0ffee-token b"));
        // Its base64 form inside a longer base64 text still goes.
        use base64::engine::general_purpose::STANDARD;
        let inside = STANDARD.encode(b"xyhunter2-secretzz");
        assert!(sc.is_match(&inside), "{inside}");
    }

    #[test]
    fn an_automaton_is_built_only_for_a_text_that_may_hold_one_of_its_secrets() {
        // Thousands of secrets: many chunks, none built until a text needs one.
        // The first and the last overlap ("...overlap-beta..."): they fall in different chunks.
        let mut many: Vec<String> = vec!["alpha-overlap-beta".to_string()];
        many.extend((1..2999).map(|i| format!("pw-{i:04}-{i:x}-secret")));
        many.push("overlap-beta-gamma".to_string());
        let sc = scrubber(&many.iter().map(String::as_str).collect::<Vec<_>>());
        let built = |sc: &Scrubber| {
            sc.chunks
                .iter()
                .filter(|c| c.matcher.get().is_some())
                .count()
        };
        assert!(sc.chunks.len() > 3, "{} chunks", sc.chunks.len());
        for text in ["vm-1 on pve01", "no pw here", "pw-", "pw-abcd"] {
            assert!(matches!(sc.scrub(text), Cow::Borrowed(_)), "{text}");
            assert!(!sc.is_match(text), "{text}");
        }
        assert_eq!(built(&sc), 0);
        // One secret builds the chunks of the patterns that start like its windows: its own,
        // and the next for those starting `pw-1` too; two overlapping secrets of two chunks
        // are one run.
        assert_eq!(
            sc.scrub(&format!("a {} b", many[1500])),
            format!("a {REDACTED} b")
        );
        assert!((1..=2).contains(&built(&sc)), "{}", built(&sc));
        let text = format!("{}|alpha-overlap-beta-gamma!", many[1500]);
        assert_eq!(sc.scrub(&text), format!("{REDACTED}|{REDACTED}!"));
        assert!(
            built(&sc) >= 2 && built(&sc) < sc.chunks.len(),
            "{}",
            built(&sc)
        );
        assert!(sc.is_match(&format!("x{}y", many[2000])));
        // Every secret, in every chunk, is still found: clones share what is built.
        let clone = sc.clone();
        for s in &many {
            assert_eq!(
                clone.scrub(&format!("<{s}>")),
                format!("<{REDACTED}>"),
                "{s}"
            );
        }
        assert_eq!(built(&sc), sc.chunks.len());
    }

    #[test]
    fn scrubs_plain_and_base64_forms() {
        let sc = scrubber(&["canary-secret-1234"]);
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
        for offset in 0..6 {
            for tail in ["", "t", "tail"] {
                let long = format!("{}canary-secret-1234{tail}", "x".repeat(offset));
                for enc in [STANDARD.encode(&long), URL_SAFE_NO_PAD.encode(&long)] {
                    let out = sc.scrub(&enc);
                    assert!(
                        out.contains(REDACTED),
                        "offset {offset} tail {tail:?}: {out}"
                    );
                }
            }
        }
    }

    /// A secret known only by its digests (a kept plan's) is scrubbed from a text exactly as
    /// the scrubber that knows it in clear scrubs it: every form, overlapping runs joined, and
    /// next to a secret known in clear.
    #[test]
    fn a_secret_known_only_by_its_digests_is_scrubbed_as_if_known_in_clear() {
        let key = DigestKey::derive(b"the fingerprint key");
        let secret = "p<a>&ss \"w\"/rd+\u{fc}";
        let mut clear = Secrets::new();
        clear.add(secret);
        let digests = clear.digests(key);
        let stored = serde_json::to_string(&digests).unwrap();
        assert!(!stored.contains("ss") && !stored.contains("rd"), "{stored}");
        let mut known = Secrets::new();
        known.add("a-secret-in-clear");
        known.add_digests(key, &digests);
        let mut both = clear.clone();
        both.add("a-secret-in-clear");
        let serde = serde_json::to_string(&serde_json::json!({ "v": secret })).unwrap();
        let b64 = STANDARD.encode(format!("user:{secret}"));
        let text = format!(
            "plain {secret} json {serde} html {} pct {} b64 {b64} twice {secret}{secret} clear a-secret-in-clear",
            "p&lt;a&gt;&amp;ss &quot;w&quot;/rd+\u{fc}",
            percent_encode(secret),
        );
        let out = known.scrubber().scrub(&text).into_owned();
        assert_eq!(out, both.scrubber().scrub(&text));
        assert!(!out.contains("ss") && !out.contains("in-clear"), "{out}");
        // A key of its own finds nothing: the digests are of no use without planbot's key.
        let mut other = Secrets::new();
        other.add_digests(DigestKey::derive(b"another key"), &digests);
        assert_eq!(other.scrubber().scrub(&text), text);
    }

    #[test]
    fn scrubs_escaped_and_encoded_forms() {
        let secret = "p<a>&ss \"w\"/rd+ü\n";
        let sc = scrubber(&[secret]);
        let go_json = r#"{"v":"p\u003ca\u003e\u0026ss \"w\"/rd+ü\n"}"#;
        let serde = serde_json::to_string(&serde_json::json!({ "v": secret })).unwrap();
        let html = "p&lt;a&gt;&amp;ss &quot;w&quot;/rd+ü\n";
        let form: String = url::form_urlencoded::byte_serialize(secret.as_bytes()).collect();
        let pct = percent_encode(secret);
        for text in [
            go_json.to_string(),
            serde,
            html.to_string(),
            form,
            pct.clone(),
        ] {
            let out = sc.scrub(&text);
            assert!(out.contains(REDACTED), "{text} -> {out}");
            assert!(!out.contains("ss"), "{text} -> {out}");
        }
        assert!(sc.scrub(&pct.to_ascii_lowercase_hex()).contains(REDACTED));
    }

    #[test]
    fn multi_line_and_padded_secrets_are_scrubbed_line_by_line_and_trimmed() {
        let key = "-----BEGIN KEY-----\nMIIEvAIBADANBgkqhkiG9w0B\nAQEFAASC\n-----END KEY-----\n";
        let sc = scrubber(&[key, "  padded-token  "]);
        let log = "line: MIIEvAIBADANBgkqhkiG9w0B\n    AQEFAASC\nthe token is padded-token.";
        let out = sc.scrub(log);
        assert!(!out.contains("MIIEvAIBADANBgkqhkiG9w0B"), "{out}");
        assert!(!out.contains("AQEFAASC"), "{out}");
        assert!(!out.contains("padded-token"), "{out}");
    }

    #[test]
    fn collects_values_under_true_masks_at_every_depth() {
        let plan = Plan::from_json(
            br#"{"format_version":"1.2","resource_changes":[{"address":"x.y","mode":"managed",
              "change":{"actions":["create"],
                "before":{"old":"old-secret"},"before_sensitive":{"old":true},
                "after":{"a":"plain-value","b":{"c":"deep-secret"},"l":["l0-open","l1-secret"],"w":{"k":"whole-secret","n":12345},
                  "set":[{"p":"set-open"},{"p":"set-secret"}],"nested":[[{"q":"nested-secret"}]]},
                "after_sensitive":{"b":{"c":true},"l":[false,true],"w":true,"set":[{},{"p":true}],"nested":[[{"q":true}]]}}}],
              "resource_drift":[{"address":"x.y","mode":"managed","change":{"actions":["update"],
                "after":{"d":"drift-secret"},"after_sensitive":{"d":true}}}],
              "output_changes":{"o":{"actions":["create"],"after":{"k":"output-secret"},"after_sensitive":true},
                                "p":{"actions":["create"],"after":"public-output","after_sensitive":false}}}"#,
        )
        .unwrap();
        let secrets = Secrets::from_plan(&plan);
        let got: Vec<&str> = secrets.iter().collect();
        assert_eq!(
            got,
            vec![
                "12345",
                "deep-secret",
                "drift-secret",
                "l1-secret",
                "nested-secret",
                "old-secret",
                "output-secret",
                "set-secret",
                "whole-secret"
            ]
        );
    }

    #[test]
    fn collects_sensitive_variables_defaults_and_state_values() {
        let plan = Plan::from_json(
            br#"{"format_version":"1.2","resource_changes":[],
              "variables":{"pw":{"value":"given-value"},"name":{"value":"web-open"}},
              "configuration":{"root_module":{"variables":{"pw":{"sensitive":true,"default":"default-secret"},"name":{"default":"web-open"}},
                "module_calls":{"m":{"module":{"variables":{"token":{"sensitive":true,"default":"module-default-secret"}}}}}}},
              "prior_state":{"values":{"outputs":{"o":{"sensitive":true,"value":"prior-output-secret"}},
                "root_module":{"resources":[{"address":"data.x.y","values":{"key":"data-source-secret","id":"open-id"},"sensitive_values":{"key":true}}],
                  "child_modules":[{"resources":[{"values":{"k":["child-open","child-secret"]},"sensitive_values":{"k":[false,true]}}]}]}}},
              "planned_values":{"root_module":{"resources":[{"values":{"z":"planned-secret"},"sensitive_values":{"z":true}}]}}}"#,
        )
        .unwrap();
        let secrets = Secrets::from_plan(&plan);
        let got: Vec<&str> = secrets.iter().collect();
        assert_eq!(
            got,
            vec![
                "child-secret",
                "data-source-secret",
                "default-secret",
                "given-value",
                "module-default-secret",
                "planned-secret",
                "prior-output-secret"
            ]
        );
    }

    #[test]
    fn scrub_json_keeps_json_valid_whatever_the_secret_holds() {
        let sc = scrubber(&["tricky\\\"secret"]);
        let v = serde_json::json!({"a": ["x tricky\\\"secret y"], "tricky\\\"secret": 1});
        let out = serde_json::to_string(&sc.scrub_json(&v)).unwrap();
        assert_eq!(
            out,
            r#"{"a":["x (sensitive value) y"],"(sensitive value)":1}"#
        );
    }

    #[test]
    fn a_plain_token_has_no_other_text_form() {
        // Each encoding leaves these characters as they are, so the shortcut loses nothing.
        let s = "Abc-12.x_Z";
        let form: String = url::form_urlencoded::byte_serialize(s.as_bytes()).collect();
        let json = serde_json::to_string(s).unwrap();
        assert_eq!(form, s);
        assert_eq!(percent_encode(s), s);
        assert_eq!(&json[1..json.len() - 1], s);
        assert_eq!(text_forms(s), vec![s.to_string()]);
        assert!(text_forms("a~b").len() > 1);
    }

    #[test]
    fn secrets_are_told_by_their_name() {
        for secret in [
            "TF_HTTP_PASSWORD",
            "PROXMOX_VE_API_TOKEN",
            "AWS_SECRET_ACCESS_KEY",
            "TF_VAR_db_passphrase",
            "GOOGLE_CREDENTIALS",
            "TF_ENCRYPTION",
            "tf_token_gitlab_example_com",
            "PM_PASS",
        ] {
            assert!(is_secret_name(secret), "{secret}");
        }
        for plain in [
            "TF_HTTP_USERNAME",
            "TF_HTTP_ADDRESS",
            "TF_HTTP_LOCK_METHOD",
            "PROXMOX_VE_ENDPOINT",
            "TF_VAR_vm_name",
        ] {
            assert!(!is_secret_name(plain), "{plain}");
        }
    }

    #[test]
    fn short_values_are_not_scrubbed_as_text() {
        let mut s = Secrets::new();
        s.add("1");
        s.add("yes");
        assert!(s.is_empty());
        assert!(s.scrubber().is_empty());
        assert_eq!(Scrubber::none().scrub("a yes 1"), "a yes 1");
    }
}
