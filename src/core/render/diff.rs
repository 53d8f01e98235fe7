//! Attribute diffs for the note: only changed leaves, by path, through the unknown and sensitivity
//! masks; multi-line, base64, `data:` URL and JSON strings decoded and shown as line diffs.

use crate::core::plan::Json;
use base64::Engine as _;
use serde_json::Value;
use serde_json_borrow::ObjectAsVec;
use similar::{ChangeTag, TextDiff};
use std::fmt::Write as _;

/// The fixed words used inside diff blocks; they come from `templates/note_phrases.j2`.
#[derive(Debug, Clone)]
pub struct Phrases {
    pub known_after_apply: String,
    pub sensitive: String,
    pub forces_replacement: String,
    pub decoded_data_url: String,
    pub decoded_base64: String,
    pub pretty_json: String,
    pub embedded_file: String,
    pub shown_below: String,
    /// What stands for the value of a write-only attribute (never kept, so never shown).
    pub write_only: String,
}

/// One side-by-side view of a value: before/after with their masks (any may be missing).
#[derive(Clone, Copy, Default)]
pub struct Node<'a> {
    pub before: Option<&'a Json<'a>>,
    pub after: Option<&'a Json<'a>>,
    pub unknown: Option<&'a Json<'a>>,
    pub before_sensitive: Option<&'a Json<'a>>,
    pub after_sensitive: Option<&'a Json<'a>>,
}

fn present<'a>(v: Option<&'a Json<'a>>) -> Option<&'a Json<'a>> {
    v.filter(|v| !v.is_null())
}

fn is_true(v: Option<&Json>) -> bool {
    matches!(v, Some(Json::Bool(true)))
}

impl<'a> Node<'a> {
    pub fn new(
        before: &'a Json<'a>,
        after: &'a Json<'a>,
        unknown: &'a Json<'a>,
        before_sensitive: &'a Json<'a>,
        after_sensitive: &'a Json<'a>,
    ) -> Node<'a> {
        Node {
            before: Some(before),
            after: Some(after),
            unknown: Some(unknown),
            before_sensitive: Some(before_sensitive),
            after_sensitive: Some(after_sensitive),
        }
    }

    /// One change's values, from `before` to `after` (`reversed`: from `after` to `before`,
    /// the sensitivity masks swapped with them).
    pub fn of_change(c: &'a crate::core::plan::Values<'a>, reversed: bool) -> Node<'a> {
        if reversed {
            Node::new(
                &c.after,
                &c.before,
                &c.after_unknown,
                &c.after_sensitive,
                &c.before_sensitive,
            )
        } else {
            Node::new(
                &c.before,
                &c.after,
                &c.after_unknown,
                &c.before_sensitive,
                &c.after_sensitive,
            )
        }
    }

    fn key(&self, k: &str) -> Node<'a> {
        let get = |v: Option<&'a Json<'a>>| v.and_then(|v| v.as_object()).and_then(|m| m.get(k));
        Node {
            before: get(self.before),
            after: get(self.after),
            unknown: get(self.unknown),
            before_sensitive: get(self.before_sensitive),
            after_sensitive: get(self.after_sensitive),
        }
    }

    fn index(&self, i: usize) -> Node<'a> {
        let get = |v: Option<&'a Json<'a>>| v.and_then(|v| v.as_array()).and_then(|a| a.get(i));
        Node {
            before: get(self.before),
            after: get(self.after),
            unknown: get(self.unknown),
            before_sensitive: get(self.before_sensitive),
            after_sensitive: get(self.after_sensitive),
        }
    }
}

/// The diff lines of one value (no fence), and how many unchanged leaves were hidden.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DiffBody {
    pub text: String,
    pub unchanged: usize,
    pub changed: usize,
}

/// Builds diff lines for one resource (or output) at a time.
pub struct Differ<'p> {
    phrases: &'p Phrases,
    replace_paths: Vec<String>,
    /// Paths of the write-only attributes set (see `Plan::write_only_attributes`).
    write_only: Vec<String>,
    /// The unknown mask belongs to the side shown first (a diff read from `after` to `before`:
    /// drift, from `main`'s code to reality).
    unknown_first: bool,
    out: DiffBody,
    path: String,
}

impl<'p> Differ<'p> {
    pub fn new(phrases: &'p Phrases) -> Differ<'p> {
        Differ {
            phrases,
            replace_paths: Vec::new(),
            write_only: Vec::new(),
            unknown_first: false,
            out: DiffBody::default(),
            path: String::new(),
        }
    }

    /// Paths that forced the replacement get a "# forces replacement" remark.
    pub fn with_replace_paths(mut self, paths: &[String]) -> Self {
        self.replace_paths = paths.to_vec();
        self
    }

    /// Write-only attributes at these paths: shown as such, `+` where the object is created,
    /// as a context line where it exists already (its value is sent again, never compared).
    pub fn with_write_only(mut self, paths: &[String]) -> Self {
        self.write_only = paths.to_vec();
        self
    }

    /// The node's `before` is the side the unknown mask marks (the values were swapped to read
    /// a change backwards): a value known only after the apply is shown first, `(known after
    /// apply) -> reality`.
    pub fn unknown_first(mut self) -> Self {
        self.unknown_first = true;
        self
    }

    /// Diff `node`, naming its top level `root` (empty for a resource's attributes).
    pub fn diff(mut self, root: &str, node: Node<'_>) -> DiffBody {
        self.path.clear();
        self.path.push_str(root);
        self.walk(node);
        self.out
    }

    /// One node, by what it is: a sensitive value, a value known only after the apply, an
    /// object or a list (walked key by key, index by index), or a leaf.
    fn walk<'a>(&mut self, n: Node<'a>) {
        if !self.write_only.is_empty() && self.write_only.contains(&self.path) {
            let sign = if n.before.is_none() { '+' } else { ' ' };
            let w = self.phrases.write_only.clone();
            self.line(sign, &format!("= {w}"));
            return;
        }
        let before = present(n.before);
        let after = present(n.after);
        let is_obj = |v: Option<&Json>| v.is_none_or(Json::is_object);
        let is_arr = |v: Option<&Json>| v.is_none_or(Json::is_array);
        let unknown_obj = n.unknown.and_then(Json::as_object);
        let nonempty = |v: Option<&Json>| match v {
            Some(Json::Object(m)) => !m.is_empty(),
            Some(Json::Array(a)) => !a.is_empty(),
            _ => false,
        };
        if is_true(n.before_sensitive) || is_true(n.after_sensitive) {
            self.sensitive(before, after, is_true(n.unknown));
        } else if is_true(n.unknown) {
            self.known_after_apply(before, after);
        } else if (before.is_some()
            || after.is_some()
            || unknown_obj.is_some_and(|m| !m.is_empty()))
            && is_obj(before)
            && is_obj(after)
            && (nonempty(before) || nonempty(after) || unknown_obj.is_some_and(|m| !m.is_empty()))
        {
            self.walk_object(n, before, after);
        } else if (before.is_some() || after.is_some())
            && is_arr(before)
            && is_arr(after)
            && (nonempty(before) || nonempty(after))
        {
            self.walk_array(n, before, after);
        } else {
            self.leaf(before, after);
        }
    }

    /// A sensitive value: only whether it is added, removed or changed, never the value.
    fn sensitive(&mut self, before: Option<&Json>, after: Option<&Json>, unknown: bool) {
        if !unknown && before == after {
            if before.is_some() {
                self.out.unchanged += 1;
            }
            return;
        }
        let s = &self.phrases.sensitive;
        // The side the unknown mask marks will have a value.
        let (had, has) = if self.unknown_first {
            (before.is_some() || unknown, after.is_some())
        } else {
            (before.is_some(), after.is_some() || unknown)
        };
        match (had, has) {
            (false, _) => self.line('+', &format!("= {s}")),
            (true, false) => self.line('-', &format!("= {s}")),
            (true, true) => self.line('~', &format!("= {s}")),
        }
    }

    /// A value the engine knows only after the apply.
    fn known_after_apply(&mut self, before: Option<&Json>, after: Option<&Json>) {
        let kaa = self.phrases.known_after_apply.clone();
        if self.unknown_first {
            match after {
                None => self.line('-', &format!("= {kaa}")),
                Some(a) => {
                    let a = short_repr(a);
                    self.line('~', &format!("= {kaa} -> {a}"));
                }
            }
            return;
        }
        match before {
            None => self.line('+', &format!("= {kaa}")),
            Some(b) => {
                let b = short_repr(b);
                self.line('~', &format!("= {b} -> {kaa}"));
            }
        }
    }

    /// An object: every key of either side (or of the unknown mask), in order.
    fn walk_object<'a>(
        &mut self,
        n: Node<'a>,
        before: Option<&'a Json<'a>>,
        after: Option<&'a Json<'a>>,
    ) {
        static EMPTY: std::sync::LazyLock<ObjectAsVec<'static>> =
            std::sync::LazyLock::new(ObjectAsVec::default);
        let obj = |v: Option<&'a Json<'a>>| v.and_then(Json::as_object).unwrap_or(&EMPTY);
        let (bm, am, um) = (obj(before), obj(after), obj(n.unknown));
        let sorted = |m: &ObjectAsVec| m.keys().zip(m.keys().skip(1)).all(|(a, b)| a < b);
        if sorted(bm) && sorted(am) && sorted(um) {
            self.walk_sorted_keys(n, bm, am, um);
            return;
        }
        let mut keys: Vec<&str> = Vec::new();
        for v in [before, after, n.unknown] {
            if let Some(Json::Object(m)) = v {
                keys.extend(m.keys());
            }
        }
        keys.sort_unstable();
        keys.dedup();
        for k in keys {
            let len = self.path.len();
            push_key(&mut self.path, k);
            self.walk(n.key(k));
            self.path.truncate(len);
        }
    }

    /// The keys of three maps whose keys are sorted (as the engine writes them), merged in one
    /// pass instead of looking every key up in each.
    fn walk_sorted_keys<'a>(
        &mut self,
        n: Node<'a>,
        bm: &'a ObjectAsVec<'a>,
        am: &'a ObjectAsVec<'a>,
        um: &'a ObjectAsVec<'a>,
    ) {
        let (mut bi, mut ai, mut ui) = (
            bm.iter().peekable(),
            am.iter().peekable(),
            um.iter().peekable(),
        );
        loop {
            let k = [bi.peek(), ai.peek(), ui.peek()]
                .into_iter()
                .flatten()
                .map(|(k, _)| *k)
                .min();
            let Some(k) = k else { break };
            let take = |it: &mut std::iter::Peekable<_>| match it.peek() {
                Some((key, _)) if *key == k => it.next().map(|(_, v): (&str, &'a Json<'a>)| v),
                _ => None,
            };
            let child = Node {
                before: take(&mut bi),
                after: take(&mut ai),
                unknown: take(&mut ui),
                before_sensitive: n
                    .before_sensitive
                    .and_then(Json::as_object)
                    .and_then(|m| m.get(k)),
                after_sensitive: n
                    .after_sensitive
                    .and_then(Json::as_object)
                    .and_then(|m| m.get(k)),
            };
            let len = self.path.len();
            push_key(&mut self.path, k);
            self.walk(child);
            self.path.truncate(len);
        }
    }

    /// A list: every index of the longer side.
    fn walk_array(&mut self, n: Node<'_>, before: Option<&Json>, after: Option<&Json>) {
        let len_of = |v: Option<&Json>| v.and_then(Json::as_array).map_or(0, <[Json]>::len);
        let max = len_of(before).max(len_of(after));
        for i in 0..max {
            let len = self.path.len();
            let _ = write!(self.path, "[{i}]");
            self.walk(n.index(i));
            self.path.truncate(len);
        }
    }

    /// A leaf: unchanged (counted, not shown), a text shown as a line diff when decoding it
    /// says more, or one line `= before -> after`.
    fn leaf(&mut self, before: Option<&Json>, after: Option<&Json>) {
        if before == after {
            if before.is_some() {
                self.out.unchanged += 1;
            }
            return;
        }
        let bs = before.and_then(Json::as_str);
        let as_ = after.and_then(Json::as_str);
        let textual = (bs.is_some() || before.is_none()) && (as_.is_some() || after.is_none());
        if textual {
            let bd = bs.map(|s| decode(s, self.phrases));
            let ad = as_.map(|s| decode(s, self.phrases));
            let rich = |d: &Option<Decoded>| d.as_ref().is_some_and(|d| d.is_rich());
            if rich(&bd) || rich(&ad) {
                self.text_diff(bd, ad);
                return;
            }
        }
        match (before, after) {
            (None, Some(a)) => self.line('+', &format!("= {}", repr(a))),
            (Some(b), None) => self.line('-', &format!("= {}", repr(b))),
            (Some(b), Some(a)) => self.line('~', &format!("= {} -> {}", repr(b), repr(a))),
            (None, None) => {}
        }
    }

    fn forces(&self) -> bool {
        self.replace_paths.iter().any(|p| {
            self.path == *p
                || (self.path.starts_with(p.as_str())
                    && matches!(self.path.as_bytes().get(p.len()), Some(b'.' | b'[')))
        })
    }

    /// `~ path (how it was decoded):` above a line diff.
    fn header_line(&mut self, sign: char, labels: &str) {
        self.out.changed += 1;
        let forces = self.forces();
        let body = &mut self.out.text;
        body.push(sign);
        body.push(' ');
        body.push_str(&self.path);
        body.push_str(labels);
        body.push(':');
        if forces {
            body.push_str("  ");
            body.push_str(&self.phrases.forces_replacement);
        }
        body.push('\n');
    }

    fn line(&mut self, sign: char, rest: &str) {
        self.out.changed += 1;
        let forces = self.forces();
        let body = &mut self.out.text;
        body.push(sign);
        body.push(' ');
        body.push_str(&self.path);
        body.push(' ');
        body.push_str(rest);
        if forces {
            body.push_str("  ");
            body.push_str(&self.phrases.forces_replacement);
        }
        body.push('\n');
    }

    fn text_diff(&mut self, before: Option<Decoded>, after: Option<Decoded>) {
        let sign = match (&before, &after) {
            (None, Some(_)) => '+',
            (Some(_), None) => '-',
            _ => '~',
        };
        let labels = after
            .as_ref()
            .or(before.as_ref())
            .map(|d| d.labels.join(", "))
            .unwrap_or_default();
        let header = if labels.is_empty() {
            String::new()
        } else {
            format!(" ({labels})")
        };
        self.header_line(sign, &header);
        let empty = String::new();
        let old = before.as_ref().map_or(&empty, |d| &d.text);
        let new = after.as_ref().map_or(&empty, |d| &d.text);
        line_diff(&mut self.out.text, old, new, "    ");
        // Files embedded in the document (Ignition `contents.source`), each diffed on its own.
        let no_files = Vec::new();
        let bf = before.as_ref().map_or(&no_files, |d| &d.files);
        let af = after.as_ref().map_or(&no_files, |d| &d.files);
        let mut labels: Vec<&str> = bf.iter().chain(af).map(|f| f.0.as_str()).collect();
        labels.sort_unstable();
        labels.dedup();
        for label in labels {
            let find = |fs: &Vec<(String, String, String)>| {
                fs.iter()
                    .find(|f| f.0 == label)
                    .map(|f| (f.1.clone(), f.2.clone()))
            };
            let (b, a) = (find(bf), find(af));
            if b.as_ref().map(|x| &x.1) == a.as_ref().map(|x| &x.1) {
                continue;
            }
            let fsign = match (&b, &a) {
                (None, Some(_)) => '+',
                (Some(_), None) => '-',
                _ => '~',
            };
            let how = a
                .as_ref()
                .or(b.as_ref())
                .map(|x| x.0.clone())
                .unwrap_or_default();
            let _ = writeln!(
                self.out.text,
                "{fsign}   {} {label} ({how}):",
                self.phrases.embedded_file
            );
            line_diff(
                &mut self.out.text,
                b.as_ref().map_or("", |x| &x.1),
                a.as_ref().map_or("", |x| &x.1),
                "        ",
            );
        }
    }
}

/// A unified line diff with three lines of context; `-`/`+` in column 0 so GitLab colours it.
pub fn line_diff(out: &mut String, old: &str, new: &str, indent: &str) {
    let diff = TextDiff::from_lines(old, new);
    for (i, group) in diff.grouped_ops(3).iter().enumerate() {
        if i > 0 {
            let _ = writeln!(out, " {indent}…");
        }
        for op in group {
            for change in diff.iter_changes(op) {
                out.push(match change.tag() {
                    ChangeTag::Delete => '-',
                    ChangeTag::Insert => '+',
                    ChangeTag::Equal => ' ',
                });
                out.push_str(indent);
                out.push_str(change.value().trim_end_matches(['\n', '\r']));
                out.push('\n');
            }
        }
    }
}

/// Append a map key to a path: `.name` for identifiers, `["odd key"]` otherwise.
fn push_key(path: &mut String, k: &str) {
    let ident = !k.is_empty()
        && k.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        && !k.as_bytes()[0].is_ascii_digit();
    if ident {
        if !path.is_empty() {
            path.push('.');
        }
        path.push_str(k);
    } else {
        path.push('[');
        path.push_str(&serde_json::to_string(k).unwrap_or_default());
        path.push(']');
    }
}

/// A `replace_paths` entry (`["disk", 0, "size"]`) in the same notation as diff lines.
pub fn path_string(steps: &[Value]) -> String {
    let mut p = String::new();
    for s in steps {
        match s {
            Value::String(k) => push_key(&mut p, k),
            Value::Number(n) => {
                let _ = write!(p, "[{n}]");
            }
            other => {
                let _ = write!(p, "[{other}]");
            }
        }
    }
    p
}

/// A value on one line: JSON (strings quoted and escaped).
pub fn repr(v: &impl serde::Serialize) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

/// Like `repr`, but long or composite values shortened to `{…}`/`[…]`/`"…"` (the old side of a
/// value that becomes unknown).
fn short_repr(v: &Json) -> String {
    match v {
        Json::Object(m) if !m.is_empty() => "{…}".to_string(),
        Json::Array(a) if !a.is_empty() => "[…]".to_string(),
        Json::Str(s) if s.contains('\n') || s.len() > 120 => "\"…\"".to_string(),
        other => repr(other),
    }
}

/// A string prepared for a line diff.
struct Decoded {
    text: String,
    labels: Vec<String>,
    /// Embedded files: (label, how decoded, text).
    files: Vec<(String, String, String)>,
}

impl Decoded {
    fn is_rich(&self) -> bool {
        !self.labels.is_empty() || self.text.contains('\n')
    }
}

fn decode(s: &str, ph: &Phrases) -> Decoded {
    let mut labels = Vec::new();
    let mut text: Option<String> = None;
    if let Some(t) = decode_data_url(s) {
        labels.push(ph.decoded_data_url.clone());
        text = Some(t);
    } else if let Some(t) = decode_base64_text(s) {
        labels.push(ph.decoded_base64.clone());
        text = Some(t);
    }
    let mut files = Vec::new();
    let current = text.as_deref().unwrap_or(s);
    let trimmed = current.trim_start();
    if trimmed.starts_with('{') || trimmed.starts_with('[') {
        if let Ok(mut doc) = serde_json::from_str::<Value>(current) {
            let nonempty = match &doc {
                Value::Object(m) => !m.is_empty(),
                Value::Array(a) => !a.is_empty(),
                _ => false,
            };
            if nonempty {
                extract_files(&mut doc, &mut String::new(), None, &mut files, ph);
                if let Ok(p) = serde_json::to_string_pretty(&doc) {
                    labels.push(ph.pretty_json.clone());
                    text = Some(p + "\n");
                }
            }
        }
    }
    Decoded {
        text: text.unwrap_or_else(|| s.to_string()),
        labels,
        files,
    }
}

/// Replace encoded or multi-line strings inside a JSON document by a placeholder and collect
/// them decoded, labelled by the Ignition `path` of their file when there is one.
fn extract_files(
    v: &mut Value,
    json_path: &mut String,
    file_path: Option<&str>,
    files: &mut Vec<(String, String, String)>,
    ph: &Phrases,
) {
    match v {
        Value::Object(m) => {
            let own = m.get("path").and_then(Value::as_str).map(str::to_string);
            let fp = own.as_deref().or(file_path);
            for (k, child) in m.iter_mut() {
                let len = json_path.len();
                push_key(json_path, k);
                extract_files(child, json_path, fp, files, ph);
                json_path.truncate(len);
            }
        }
        Value::Array(a) => {
            for (i, child) in a.iter_mut().enumerate() {
                let len = json_path.len();
                let _ = write!(json_path, "[{i}]");
                extract_files(child, json_path, file_path, files, ph);
                json_path.truncate(len);
            }
        }
        Value::String(s) => {
            let (how, text) = if let Some(t) = decode_data_url(s) {
                (ph.decoded_data_url.clone(), t)
            } else if s.contains('\n') {
                (String::new(), s.clone())
            } else {
                return;
            };
            let mut label = file_path.map_or_else(|| json_path.clone(), str::to_string);
            if files.iter().any(|f| f.0 == label) {
                label = format!("{label} {json_path}");
            }
            *s = format!("({} {label} {})", ph.embedded_file, ph.shown_below);
            files.push((label, how, text));
        }
        _ => {}
    }
}

/// Text is shown decoded only when it is plainly text: UTF-8 without control characters.
fn is_texty(s: &str) -> bool {
    !s.chars()
        .any(|c| c.is_control() && !matches!(c, '\n' | '\r' | '\t'))
}

/// `data:[<mediatype>][;base64],<data>` → its text, when it is text.
pub fn decode_data_url(s: &str) -> Option<String> {
    let rest = s.strip_prefix("data:")?;
    let comma = rest.find(',')?;
    let (meta, data) = (&rest[..comma], &rest[comma + 1..]);
    let bytes = if meta.ends_with(";base64") {
        base64_decode(data)?
    } else {
        percent_decode(data)
    };
    let text = String::from_utf8(bytes).ok()?;
    is_texty(&text).then_some(text)
}

fn base64_decode(data: &str) -> Option<Vec<u8>> {
    let data = data.trim();
    base64::engine::general_purpose::STANDARD
        .decode(data)
        .or_else(|_| base64::engine::general_purpose::STANDARD_NO_PAD.decode(data))
        .ok()
}

fn percent_decode(data: &str) -> Vec<u8> {
    let b = data.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let hex = |c: u8| (c as char).to_digit(16);
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

/// A bare base64 blob (standard alphabet) that decodes to readable text with some whitespace.
pub fn decode_base64_text(s: &str) -> Option<String> {
    if s.len() < 16
        || !s
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'='))
    {
        return None;
    }
    let text = String::from_utf8(base64_decode(s)?).ok()?;
    (is_texty(&text) && text.contains([' ', '\n'])).then_some(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    pub fn phrases() -> Phrases {
        Phrases {
            known_after_apply: "(known after apply)".into(),
            sensitive: "(sensitive value)".into(),
            forces_replacement: "# forces replacement".into(),
            decoded_data_url: "data: URL, decoded".into(),
            decoded_base64: "base64, decoded".into(),
            pretty_json: "JSON".into(),
            embedded_file: "file".into(),
            shown_below: "shown below".into(),
            write_only: "(write-only)".into(),
        }
    }

    #[test]
    fn a_write_only_attribute_is_added_on_create_and_a_context_line_where_the_object_exists() {
        let ph = phrases();
        let wo = ["password_wo".to_string()];
        let body = |before: Value, after: Value| {
            read_as_changes([before, after, json!({}), json!({}), json!({})], |n| {
                Differ::new(&ph).with_write_only(&wo).diff("", n)
            })
            .text
        };
        assert_eq!(
            body(Value::Null, json!({"name": "a", "password_wo": null})),
            "+ name = \"a\"\n+ password_wo = (write-only)\n"
        );
        assert_eq!(
            body(
                json!({"name": "a", "password_wo": null}),
                json!({"name": "b", "password_wo": null})
            ),
            "~ name = \"a\" -> \"b\"\n  password_wo = (write-only)\n"
        );
        // Without the write-only list, the null attribute says nothing at all.
        assert_eq!(
            read_as_changes(
                [
                    Value::Null,
                    json!({"password_wo": null}),
                    json!({}),
                    json!({}),
                    json!({})
                ],
                |n| Differ::new(&ph).diff("", n)
            )
            .text,
            ""
        );
    }

    /// `diff` of the five values read as a change's values are (from their JSON text).
    fn read_as_changes(values: [Value; 5], diff: impl FnOnce(Node<'_>) -> DiffBody) -> DiffBody {
        let texts = values.map(|v| v.to_string());
        let [b, a, u, bs, as_] = texts
            .each_ref()
            .map(|t| serde_json::from_str::<Json>(t).unwrap());
        diff(Node::new(&b, &a, &u, &bs, &as_))
    }

    fn diff(before: Value, after: Value, unknown: Value, bs: Value, as_: Value) -> DiffBody {
        let ph = phrases();
        read_as_changes([before, after, unknown, bs, as_], |n| {
            Differ::new(&ph).diff("", n)
        })
    }

    #[test]
    fn shows_only_changed_leaves_by_path() {
        let d = diff(
            json!({"name":"web","disk":[{"size":10,"storage":"local"}],"tags":["a","b"]}),
            json!({"name":"web","disk":[{"size":20,"storage":"local"}],"tags":["a","c","d"]}),
            json!({}),
            json!({}),
            json!({}),
        );
        assert_eq!(
            d.text,
            "~ disk[0].size = 10 -> 20\n~ tags[1] = \"b\" -> \"c\"\n+ tags[2] = \"d\"\n"
        );
        assert_eq!(d.unchanged, 3);
    }

    #[test]
    fn never_prints_sensitive_values_at_any_depth() {
        let d = diff(
            json!({"a":{"pw":"old-secret"},"l":["x","list-secret"],"w":{"k":"whole"}}),
            json!({"a":{"pw":"new-secret"},"l":["x","list-secret2"],"w":{"k":"whole2"}}),
            json!({}),
            json!({"a":{"pw":true},"l":[false,true],"w":true}),
            json!({"a":{"pw":true},"l":[false,true],"w":true}),
        );
        assert!(
            !d.text.contains("secret") && !d.text.contains("whole"),
            "{}",
            d.text
        );
        assert_eq!(d.text.matches("(sensitive value)").count(), 3, "{}", d.text);
    }

    #[test]
    fn unknown_values_say_known_after_apply() {
        let d = diff(
            json!(null),
            json!({"name":"x"}),
            json!({"id":true}),
            json!({}),
            json!({}),
        );
        assert_eq!(d.text, "+ id = (known after apply)\n+ name = \"x\"\n");
    }

    #[test]
    fn data_urls_and_base64_blobs_are_decoded() {
        assert_eq!(
            decode_data_url("data:;base64,aGVsbG8gd29ybGQ=").as_deref(),
            Some("hello world")
        );
        assert_eq!(decode_data_url("data:,a%20b").as_deref(), Some("a b"));
        assert_eq!(
            decode_base64_text("aGVsbG8gd29ybGQgYW5kIG1vcmU=").as_deref(),
            Some("hello world and more")
        );
        assert_eq!(decode_base64_text("0123456789abcdef0123"), None);
    }
}
