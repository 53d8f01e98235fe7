//! Which parts of the plan document a set's policies can read: the top-level keys they name
//! after `input` (`input.resource_changes`, `input["prior_state"]`), or the whole document as
//! soon as one use of `input` names no key.
//!
//! Reading a plan into the interpreter costs more than most rules take to run, and a real
//! `show -json` document is mostly `planned_values`, `prior_state` and `configuration`, which
//! most policies never look at. A key no policy names cannot change a verdict: the only way to
//! reach a value of the document is through `input`, and every use of `input` that does not
//! name its key (`input` alone, `input[k]`, `object.keys(input)`, `walk(input, …)`,
//! `import input`, `with input as …`) reads the whole document. Comments and strings are
//! skipped; anything unusual reads everything, so a doubt costs time, never a verdict.

use std::collections::BTreeSet;

/// What of the plan document a set reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InputReads {
    /// Every key.
    Whole,
    /// Only these top-level keys (none: the policies never read the plan).
    Keys(BTreeSet<String>),
}

impl InputReads {
    /// What the policy texts read together.
    pub fn of<'a>(texts: impl IntoIterator<Item = &'a str>) -> InputReads {
        texts
            .into_iter()
            .map(reads_of_text)
            .fold(InputReads::Keys(BTreeSet::new()), InputReads::union)
    }

    /// What either reads.
    pub fn union(self, other: InputReads) -> InputReads {
        match (self, other) {
            (InputReads::Keys(mut a), InputReads::Keys(b)) => {
                a.extend(b);
                InputReads::Keys(a)
            }
            _ => InputReads::Whole,
        }
    }

    /// Whether `key` is read.
    pub fn reads(&self, key: &str) -> bool {
        match self {
            InputReads::Whole => true,
            InputReads::Keys(keys) => keys.contains(key),
        }
    }
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// The keys one file names after `input`, skipping comments and strings.
fn reads_of_text(text: &str) -> InputReads {
    let bytes = text.as_bytes();
    let mut keys = BTreeSet::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'#' => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
            }
            b'"' => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            b'`' => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'`' {
                    i += 1;
                }
                i += 1;
            }
            c if is_ident(c) => {
                let start = i;
                while i < bytes.len() && is_ident(bytes[i]) {
                    i += 1;
                }
                if &text[start..i] == "input" {
                    match key_after(&text[i..]) {
                        Some(key) => {
                            keys.insert(key);
                        }
                        None => return InputReads::Whole,
                    }
                }
            }
            _ => i += 1,
        }
    }
    InputReads::Keys(keys)
}

/// The key right after an `input`: `.name` or `["name"]` (a plain string, no escapes).
fn key_after(rest: &str) -> Option<String> {
    if let Some(after_dot) = rest.strip_prefix('.') {
        let name: String = after_dot
            .bytes()
            .take_while(|c| is_ident(*c))
            .map(char::from)
            .collect();
        return (!name.is_empty() && !name.as_bytes()[0].is_ascii_digit()).then_some(name);
    }
    let quoted = rest.strip_prefix("[\"")?;
    let end = quoted.find('"')?;
    let name = &quoted[..end];
    (!name.contains('\\') && quoted[end + 1..].starts_with(']')).then(|| name.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(list: &[&str]) -> InputReads {
        InputReads::Keys(list.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn named_keys_are_read() {
        let text = r#"package main
import rego.v1
import input.configuration as conf
deny contains msg if {
    some rc in input.resource_changes
    input["prior_state"].values != null
    msg := "x"
}"#;
        assert_eq!(
            InputReads::of([text]),
            keys(&["configuration", "prior_state", "resource_changes"])
        );
    }

    #[test]
    fn every_unnamed_use_reads_the_whole_document() {
        for text in [
            "deny contains k if { some k, _ in input }",
            "deny contains k if { k := object.keys(input) }",
            "deny contains k if { walk(input, [p, v]) }",
            "deny contains k if { x := input[k] }",
            "import input",
            "import input as plan",
            "deny contains m if { m := f with input as {} }",
            "deny contains m if { m := input }",
            "deny contains m if { m := input . resource_changes }",
            r#"deny contains m if { m := input["a\"b"] }"#,
            "deny contains m if { m := input.0 }",
        ] {
            assert_eq!(InputReads::of([text]), InputReads::Whole, "{text}");
        }
    }

    #[test]
    fn comments_strings_and_longer_names_are_not_uses() {
        let text = r#"# the input is the whole plan: input
deny contains m if {
    my_input := 1
    input_x := 2
    m := sprintf("input %v `input`", [input.resource_changes])
    n := `raw input`
}"#;
        assert_eq!(InputReads::of([text]), keys(&["resource_changes"]));
    }

    #[test]
    fn sets_read_what_any_file_reads() {
        let a = "x if { input.variables }";
        let b = "y if { input.resource_changes }";
        assert_eq!(
            InputReads::of([a, b]),
            keys(&["resource_changes", "variables"])
        );
        assert_eq!(InputReads::of([a, "z := input"]), InputReads::Whole);
        assert_eq!(InputReads::of(["package p"]), keys(&[]));
    }
}
