//! The value budget of a `show -json` document, counted on its bytes before anything is built.
//!
//! Bytes alone do not bound what a plan costs: a value held in memory (a `serde_json::Value`,
//! the policy interpreter's value, a diff line) costs tens to hundreds of bytes whatever its
//! text, and `1,` is two bytes. Under the 32 MiB cap a plan of a million small numbers in one
//! resource took planbot from 24 to 500 MiB. So a document is also refused when it holds:
//!
//! - more than [`MAX_VALUES`] values in all (a realistic 10,000-resource plan, with
//!   `planned_values`, `prior_state` and `configuration`, holds 1.5 million), or
//! - more than [`MAX_DATA_VALUES`] values in one resource's or output's data: the subtree under
//!   one of the keys that carry configuration values (`before`, `after`, `values`,
//!   `value`…). Planbot handles those one resource at a time; a real resource holds tens.
//!
//! The count is a byte scan (string- and escape-aware, no allocation but the key being read):
//! every container, object member and separator counts one (about one per value). [`Budget`] is fed the
//! document in pieces, so a reader is checked as it is read ([`BudgetReader`]).

use std::io::Read;

/// The most values a plan document may hold in all.
pub const MAX_VALUES: u64 = 4_000_000;

/// The most values one resource's (or output's, or variable's) data may hold.
pub const MAX_DATA_VALUES: u64 = 100_000;

/// Keys whose value is configuration data (a resource's attributes, an output's value).
const DATA_KEYS: &[&[u8]] = &[
    b"before",
    b"after",
    b"after_unknown",
    b"before_sensitive",
    b"after_sensitive",
    b"values",
    b"sensitive_values",
    b"value",
    b"constant_value",
];

/// How deep a data subtree opens at the least (the document's object is 1): a change's
/// `before` is at 5, a planned resource's `values` at 6, an output's `after` or a variable's
/// `value` at 4; `prior_state.values` (the whole prior state) at 3 is not one.
const DATA_DEPTH: u32 = 4;

/// Why a document was refused; the text is what a note says.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OverBudget {
    #[error("the plan has too many values ({values} or more, cap {max}): planbot refuses it before reading it, as it would take too much memory")]
    Total { values: u64, max: u64 },
    #[error("one resource or output of the plan has too many values ({values} or more under `{key}`, cap {max}): planbot refuses the plan before reading it, as it would take too much memory")]
    Data { key: String, values: u64, max: u64 },
}

/// The scanner's state between two pieces of a document.
#[derive(Debug)]
pub struct Budget {
    max_values: u64,
    max_data: u64,
    values: u64,
    depth: u32,
    in_string: bool,
    escaped: bool,
    /// The last string closed outside a data subtree (a key when a `:` follows), short only.
    string: Vec<u8>,
    string_too_long: bool,
    /// The key just read (`"key":` seen) and not yet given its value.
    pending_key: Option<Vec<u8>>,
    /// The outermost data subtree open: its depth, its key, the count when it opened.
    data: Option<(u32, Vec<u8>, u64)>,
    /// The first refusal (the scan stops counting there).
    over: Option<OverBudget>,
}

impl Default for Budget {
    fn default() -> Budget {
        Budget::new(MAX_VALUES, MAX_DATA_VALUES)
    }
}

impl Budget {
    pub fn new(max_values: u64, max_data: u64) -> Budget {
        Budget {
            max_values,
            max_data,
            values: 0,
            depth: 0,
            in_string: false,
            escaped: false,
            string: Vec::new(),
            string_too_long: false,
            pending_key: None,
            data: None,
            over: None,
        }
    }

    /// The whole of `json` against the default caps.
    pub fn check(json: &[u8]) -> Result<u64, OverBudget> {
        let mut b = Budget::default();
        b.feed(json)?;
        Ok(b.values)
    }

    /// The values counted so far.
    pub fn values(&self) -> u64 {
        self.values
    }

    /// Scan the next piece of the document.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<(), OverBudget> {
        if let Some(over) = &self.over {
            return Err(over.clone());
        }
        for &c in bytes {
            if self.in_string {
                if self.escaped {
                    self.escaped = false;
                } else if c == b'\\' {
                    self.escaped = true;
                } else if c == b'"' {
                    self.in_string = false;
                    continue;
                }
                if self.data.is_none() && !self.string_too_long {
                    if self.string.len() < 32 {
                        self.string.push(c);
                    } else {
                        self.string_too_long = true;
                    }
                }
                continue;
            }
            match c {
                b'"' => {
                    self.in_string = true;
                    self.string.clear();
                    self.string_too_long = false;
                }
                b':' => {
                    self.count()?;
                    if self.data.is_none() && !self.string_too_long {
                        self.pending_key = Some(std::mem::take(&mut self.string));
                    }
                }
                b'{' | b'[' => {
                    self.count()?;
                    self.depth += 1;
                    if self.data.is_none() {
                        if let Some(key) = self.pending_key.take() {
                            // `prior_state.values` (depth 3) is the whole state, not data.
                            if self.depth >= DATA_DEPTH && DATA_KEYS.contains(&key.as_slice()) {
                                self.data = Some((self.depth, key, self.values));
                            }
                        }
                    }
                }
                b'}' | b']' => {
                    if self.data.as_ref().is_some_and(|(d, _, _)| *d == self.depth) {
                        self.data = None;
                    }
                    self.depth = self.depth.saturating_sub(1);
                }
                b',' => self.count()?,
                b' ' | b'\n' | b'\r' | b'\t' => continue,
                _ => {}
            }
            if c != b':' {
                self.pending_key = None;
            }
        }
        Ok(())
    }

    fn count(&mut self) -> Result<(), OverBudget> {
        self.values += 1;
        let over = if self.values > self.max_values {
            Some(OverBudget::Total {
                values: self.values,
                max: self.max_values,
            })
        } else {
            match &self.data {
                Some((_, key, start)) if self.values - start > self.max_data => {
                    Some(OverBudget::Data {
                        key: String::from_utf8_lossy(key).into_owned(),
                        values: self.values - start,
                        max: self.max_data,
                    })
                }
                _ => None,
            }
        };
        match over {
            Some(over) => {
                self.over = Some(over.clone());
                Err(over)
            }
            None => Ok(()),
        }
    }

    /// The refusal, if the document went over.
    pub fn over(&self) -> Option<&OverBudget> {
        self.over.as_ref()
    }
}

/// A reader that counts what passes through it and fails with an I/O error (of kind
/// `InvalidData`) the moment the document goes over its budget; [`BudgetReader::over`] says why.
pub struct BudgetReader<R> {
    inner: R,
    budget: Budget,
}

impl<R: Read> BudgetReader<R> {
    pub fn new(inner: R) -> BudgetReader<R> {
        BudgetReader {
            inner,
            budget: Budget::default(),
        }
    }

    pub fn over(&self) -> Option<&OverBudget> {
        self.budget.over()
    }
}

impl<R: Read> Read for BudgetReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.budget
            .feed(&buf[..n])
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))?;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containers_members_and_elements_count_and_strings_do_not_confuse_it() {
        // `{` `:` `[` `,` `,` `,` `:`: the punctuation in the string counts nothing.
        assert_eq!(
            Budget::check(br#"{"a":[1,2,3],"b":"x,[{:\"]"}"#).unwrap(),
            7
        );
        assert_eq!(Budget::check(b"[]").unwrap(), 1);
    }

    #[test]
    fn a_million_small_numbers_in_one_resource_are_refused_and_many_resources_are_not() {
        let numbers = vec!["1"; 200_001].join(",");
        let one =
            format!(r#"{{"resource_changes":[{{"change":{{"after":{{"input":[{numbers}]}}}}}}]}}"#);
        let e = Budget::check(one.as_bytes()).unwrap_err();
        assert!(
            matches!(e, OverBudget::Data { ref key, .. } if key == "after"),
            "{e}"
        );
        assert!(e.to_string().contains("cap 100000"), "{e}");
        // The same numbers spread over resources of 50 each are a big plan, not a refusal.
        let resource = format!(
            r#"{{"change":{{"after":{{"input":[{}]}}}}}}"#,
            vec!["1"; 50].join(",")
        );
        let many = format!(
            r#"{{"resource_changes":[{}]}}"#,
            vec![resource; 4_000].join(",")
        );
        assert!(Budget::check(many.as_bytes()).is_ok());
        // The whole prior state under `prior_state.values` is not one resource's data.
        let state_resource = r#"{"address":"a","values":{"n":[1,2,3]}}"#;
        let state = format!(
            r#"{{"prior_state":{{"values":{{"root_module":{{"resources":[{}]}}}}}}}}"#,
            vec![state_resource; 30_000].join(",")
        );
        assert!(Budget::check(state.as_bytes()).is_ok());
        // A key that only looks like a data key inside a string value is not one.
        let s = format!(r#"{{"name":"after","x":[{numbers}]}}"#);
        assert!(Budget::check(s.as_bytes()).is_ok());
    }

    #[test]
    fn the_total_is_capped_and_pieces_count_as_the_whole() {
        let doc = format!("[{}]", vec!["0"; 1000].join(","));
        let mut b = Budget::new(500, 100);
        let e = b.feed(doc.as_bytes()).unwrap_err();
        assert!(matches!(e, OverBudget::Total { max: 500, .. }), "{e}");
        let mut b = Budget::default();
        for piece in doc.as_bytes().chunks(7) {
            b.feed(piece).unwrap();
        }
        assert_eq!(b.values(), Budget::check(doc.as_bytes()).unwrap());
        let mut r = BudgetReader {
            inner: doc.as_bytes(),
            budget: Budget::new(500, 100),
        };
        let mut sink = Vec::new();
        assert!(r.read_to_end(&mut sink).is_err());
        assert!(r.over().is_some());
    }

    /// What the scan counts, from the parsed document: each container, each object member and
    /// each separator between two items.
    fn counted(v: &serde_json::Value) -> u64 {
        let items = |n: usize| n as u64 + (n as u64).saturating_sub(1);
        match v {
            serde_json::Value::Object(m) => {
                1 + items(m.len()) + m.values().map(counted).sum::<u64>()
            }
            serde_json::Value::Array(a) => {
                1 + (a.len() as u64).saturating_sub(1) + a.iter().map(counted).sum::<u64>()
            }
            _ => 0,
        }
    }

    #[test]
    fn strings_skipped_to_their_end_count_as_read_byte_by_byte_whatever_the_pieces() {
        // Strings in and out of data, long keys, escaped quotes and backslashes, punctuation,
        // `\u0022`, a backslash just before the closing quote, non-ASCII.
        let long_key = "k".repeat(40);
        let doc = format!(
            r#"{{"resource_changes":[{{"change":{{"after":{{"a\"b":"x,[{{:\\","{long_key}":["\\\\","\u0022,{{",{{"after":"]]]"}}],"n":[1,2,{{"z":null}}],"é":"ü\\n,"}}}},"address":"a,b"}}],"{long_key}":{{"after":[1,2]}},"s":"\\\\\\\"[,"}}"#
        );
        let parsed: serde_json::Value = serde_json::from_str(&doc).expect("valid JSON");
        let whole = Budget::check(doc.as_bytes()).unwrap();
        assert_eq!(whole, counted(&parsed));
        for cut in 0..=doc.len() {
            let (a, b) = doc.as_bytes().split_at(cut);
            let mut budget = Budget::default();
            budget.feed(a).unwrap();
            budget.feed(b).unwrap();
            assert_eq!(budget.values(), whole, "cut at {cut}");
        }
        // The data under `after` is still told from the rest when a key is cut in two, and
        // across whitespace: three values over a cap of two.
        let doc = br#"{"resource_changes":[{"change":{"after" :
 {"a":[1, 2]}}}]}"#;
        for cut in 0..=doc.len() {
            let mut budget = Budget::new(MAX_VALUES, 2);
            let (a, b) = doc.split_at(cut);
            let fed = budget.feed(a).and_then(|_| budget.feed(b));
            assert!(
                matches!(fed, Err(OverBudget::Data { ref key, .. }) if key == "after"),
                "cut at {cut}: {fed:?}"
            );
        }
    }
}
