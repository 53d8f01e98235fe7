//! HCL from the repository, parsed without letting it overflow planbot's stack.
//!
//! `hcl::parse` (a recursive-descent parser) and the tree it builds recurse once per nesting
//! level of brackets, blocks and templates and once per operator of a chain (`1 + 1 + …`, `!!…`,
//! `a ? b : a ? …`): a `.tf` file of a few KiB (`x = [[[…]]]` a thousand deep) overflowed the
//! stack of the thread reading an MR's module calls, and a stack overflow aborts the whole
//! process — every job and apply with it, and again at the next start, which queues the job
//! again. [`parse`] first scans the text ([`depth`]: a bound on that recursion, counted without
//! parsing, never below what the parser will need) and refuses past [`MAX_DEPTH`]; then it
//! parses on a thread of its own with [`STACK`] of stack, ample for that depth.

use std::fmt;

/// The deepest text [`parse`] takes: far beyond real configuration (a few levels of blocks,
/// collections and templates, operator chains of a few terms per value).
pub const MAX_DEPTH: usize = 500;

/// The parsing thread's stack: a level costs a few KiB of it in a debug build (a
/// thousand-deep list overflowed 2 MiB, two hundred did not), so this leaves a wide margin.
pub const STACK: usize = 64 << 20;

/// Why [`parse`] did not give a body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HclError {
    /// The text nests (or chains operators) deeper than [`MAX_DEPTH`]; at `line`.
    TooDeep { line: usize },
    /// The text is not HCL.
    Syntax,
}

impl fmt::Display for HclError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HclError::TooDeep { line } => write!(
                f,
                "nests deeper than {MAX_DEPTH} levels (brackets, blocks, templates or chained operators) at line {line}: planbot does not read it"
            ),
            HclError::Syntax => f.write_str("does not parse as HCL"),
        }
    }
}

impl std::error::Error for HclError {}

/// `text` parsed as an HCL body, and `f`'s answer about it, both on a thread with [`STACK`] of
/// stack (the body is dropped there too: dropping it recurses as deep as building it); a text
/// deeper than [`MAX_DEPTH`] is refused unparsed.
pub fn with_body<R: Send>(
    text: &str,
    f: impl FnOnce(&hcl::Body) -> R + Send,
) -> Result<R, HclError> {
    on_parse_stack(text, || hcl::parse(text).map(|body| f(&body)).ok())
}

/// [`with_body`] for the body as written (`hcl::edit`): every expression keeps its place in
/// `text` (its span), for what must quote the repository's own expressions.
pub fn with_edit_body<R: Send>(
    text: &str,
    f: impl FnOnce(&hcl::edit::structure::Body) -> R + Send,
) -> Result<R, HclError> {
    on_parse_stack(text, || {
        hcl::edit::parser::parse_body(text)
            .map(|body| f(&body))
            .ok()
    })
}

/// `parse` run on a thread with [`STACK`] of stack once [`depth`] allows `text`; `None` from
/// it, or no thread, is [`HclError::Syntax`].
fn on_parse_stack<R: Send>(
    text: &str,
    parse: impl FnOnce() -> Option<R> + Send,
) -> Result<R, HclError> {
    depth(text)?;
    std::thread::scope(|s| {
        std::thread::Builder::new()
            .name("planbot-hcl".into())
            .stack_size(STACK)
            .spawn_scoped(s, parse)
            .ok()
            // Without a thread (none can be made), the text is not read.
            .and_then(|h| h.join().ok())
            .flatten()
            .ok_or(HclError::Syntax)
    })
}

/// A frame of the scan: what the text is inside of.
enum Frame {
    /// Expressions, closed by this byte (`0`: the file's top level); `ops` operators in its
    /// current element, `lines` whether a line break ends an element (bodies, objects).
    Code { closer: u8, ops: usize, lines: bool },
    /// A quoted string.
    Quoted,
    /// A heredoc, ended by a line that is this marker.
    Heredoc(Vec<u8>),
}

/// Refuse `text` when the recursion its parse would need may pass [`MAX_DEPTH`]: one level per
/// open bracket, block, string, heredoc and template, plus one per operator character in the
/// element being read at each level (a `,` ends an element; a line break ends one in a body or
/// an object). Comments are skipped; strings and heredocs are read for their templates. Where
/// the scan is unsure it counts more, never less.
pub fn depth(text: &str) -> Result<(), HclError> {
    let mut scan = Scan {
        b: text.as_bytes(),
        i: 0,
        line: 1,
        at_line_start: true,
        stack: vec![code(0, true)],
    };
    while scan.i < scan.b.len() {
        if let Step::Jumped = scan.step() {
            continue;
        }
        if scan.levels() > MAX_DEPTH {
            return Err(HclError::TooDeep { line: scan.line });
        }
        scan.i += 1;
    }
    Ok(())
}

/// The scan of [`depth`]: where it is in the text, and the frames it is inside of.
struct Scan<'a> {
    b: &'a [u8],
    /// The byte read next.
    i: usize,
    /// The line the scan is on, for the error.
    line: usize,
    /// Whether the byte at `i` starts a line.
    at_line_start: bool,
    /// The top level first; never empty.
    stack: Vec<Frame>,
}

/// What one step of the scan did with the byte at `i`.
enum Step {
    /// Read it (and maybe the byte after it): the depth is checked, the scan goes on after it.
    Read,
    /// Skipped to `i` past a comment, a heredoc's opening line or its end marker: the scan goes
    /// on there.
    Jumped,
}

impl Scan<'_> {
    /// Read the byte at `i` as the frame on top reads it.
    fn step(&mut self) -> Step {
        let c = self.b[self.i];
        let next = self.b.get(self.i + 1).copied();
        let starts_line = self.at_line_start;
        self.at_line_start = c == b'\n';
        if c == b'\n' {
            self.line += 1;
        }
        match self.stack.last().expect("the top level is never left") {
            Frame::Quoted => {
                self.in_quoted(c, next);
                Step::Read
            }
            Frame::Heredoc(_) => self.in_heredoc(c, next, starts_line),
            Frame::Code { .. } => self.in_code(c, next),
        }
    }

    /// The levels the parse needs here: one per frame, one per operator character of the
    /// element each code frame is reading.
    fn levels(&self) -> usize {
        self.stack.len()
            + self
                .stack
                .iter()
                .map(|f| match f {
                    Frame::Code { ops, .. } => *ops,
                    _ => 0,
                })
                .sum::<usize>()
    }

    fn jump(&mut self, to: usize) -> Step {
        self.i = to;
        Step::Jumped
    }

    /// In a quoted string: an escape, its end (a quote, or a line break the parser refuses),
    /// or a template.
    fn in_quoted(&mut self, c: u8, next: Option<u8>) {
        match c {
            b'\\' => self.i += 1,
            b'"' | b'\n' => {
                self.stack.pop();
            }
            _ => self.template(c, next),
        }
    }

    /// In a heredoc: a line that is its marker ends it; elsewhere a template may open.
    fn in_heredoc(&mut self, c: u8, next: Option<u8>, starts_line: bool) -> Step {
        if starts_line {
            let end = skip_line(self.b, self.i);
            let is_marker = matches!(
                self.stack.last(),
                Some(Frame::Heredoc(marker)) if self.b[self.i..end].trim_ascii() == marker.as_slice()
            );
            if is_marker {
                self.stack.pop();
                return self.jump(end);
            }
        }
        self.template(c, next);
        Step::Read
    }

    /// In a string or heredoc: `$${` or `%%{` (escaped, read past) or `${` or `%{` (a template
    /// opens).
    fn template(&mut self, c: u8, next: Option<u8>) {
        match c {
            b'$' | b'%' if next == Some(c) => self.i += 1,
            b'$' | b'%' if next == Some(b'{') => {
                self.i += 1;
                push_template(&mut self.stack);
            }
            _ => {}
        }
    }

    /// In expressions: comments are skipped, strings, heredocs and brackets open, the closer
    /// closes, operators count; `,` (and a line break in a body or object) ends an element.
    fn in_code(&mut self, c: u8, next: Option<u8>) -> Step {
        let Some(&Frame::Code { closer, lines, .. }) = self.stack.last() else {
            unreachable!("in_code reads in a code frame")
        };
        match c {
            b'#' => return self.jump(skip_line(self.b, self.i)),
            b'/' if next == Some(b'/') => return self.jump(skip_line(self.b, self.i)),
            b'/' if next == Some(b'*') => return self.skip_block_comment(),
            b'"' => self.stack.push(Frame::Quoted),
            b'<' if next == Some(b'<') => return self.heredoc_or_operators(),
            b'(' => self.stack.push(code(b')', false)),
            b'[' => self.stack.push(code(b']', false)),
            b'{' => self.stack.push(code(b'}', true)),
            b')' | b']' | b'}' if c == closer => {
                self.stack.pop();
            }
            b',' => *self.ops() = 0,
            b'\n' if lines => *self.ops() = 0,
            b'+' | b'-' | b'*' | b'/' | b'%' | b'!' | b'?' | b':' | b'<' | b'>' | b'=' | b'&'
            | b'|' => *self.ops() += 1,
            _ => {}
        }
        Step::Read
    }

    /// The operators counted in the element the code frame on top is reading.
    fn ops(&mut self) -> &mut usize {
        match self.stack.last_mut() {
            Some(Frame::Code { ops, .. }) => ops,
            _ => unreachable!("operators are counted in a code frame"),
        }
    }

    /// `/*` at `i`: skipped through its `*/` (or the end), its lines counted.
    fn skip_block_comment(&mut self) -> Step {
        let (b, i) = (self.b, self.i);
        let end = b[i + 2..]
            .windows(2)
            .position(|w| w == b"*/")
            .map_or(b.len(), |p| i + 2 + p + 2);
        self.line += b[i..end].iter().filter(|x| **x == b'\n').count();
        self.jump(end)
    }

    /// `<<` at `i`: a heredoc when a marker ends the line (`<<EOT`, `<<-EOT`: the scan goes on
    /// at that line's end), else two operator characters.
    fn heredoc_or_operators(&mut self) -> Step {
        let b = self.b;
        let mut j = self.i + 2;
        if b.get(j) == Some(&b'-') {
            j += 1;
        }
        let start = j;
        while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_' || b[j] == b'-') {
            j += 1;
        }
        if j > start && matches!(b.get(j), Some(b'\n') | Some(b'\r')) {
            self.stack.push(Frame::Heredoc(b[start..j].to_vec()));
            return self.jump(j);
        }
        *self.ops() += 2;
        self.i += 1;
        Step::Read
    }
}

fn code(closer: u8, lines: bool) -> Frame {
    Frame::Code {
        closer,
        ops: 0,
        lines,
    }
}

/// A `${` or `%{` template: expressions up to its `}`.
fn push_template(stack: &mut Vec<Frame>) {
    stack.push(code(b'}', false));
}

/// The index of the line break ending the line at `i` (or the end).
fn skip_line(b: &[u8], i: usize) -> usize {
    b[i..]
        .iter()
        .position(|x| *x == b'\n')
        .map_or(b.len(), |p| i + p)
}

/// At most this many `terraform_remote_state` blocks are read from one directory.
pub const MAX_STATE_BLOCKS: usize = 64;

/// The `data "terraform_remote_state" "<label>"` blocks over `backend = "http"` in one
/// directory's configuration files (`(file name, text)`; `.tf`, `.tofu` and their `.json`
/// forms), at most [`MAX_STATE_BLOCKS`], one per label: the label and the block's `config` as
/// an HCL expression (as written in HCL; a `.json` file's value turned into the HCL it means).
/// A file that does not parse has none.
pub fn http_state_blocks(files: &[(String, String)]) -> Vec<(String, String)> {
    let mut blocks: Vec<(String, String)> = Vec::new();
    for (name, text) in files {
        let found = if name.ends_with(".json") {
            json_blocks(text)
        } else {
            hcl_blocks(text)
        };
        for (label, config) in found {
            if blocks.len() < MAX_STATE_BLOCKS && !blocks.iter().any(|(l, _)| *l == label) {
                blocks.push((label, config));
            }
        }
    }
    blocks
}

/// The blocks of an HCL file: each `data "terraform_remote_state" "<label>"` whose `backend` is
/// `"http"`, with its `config` expression's text as written.
fn hcl_blocks(text: &str) -> Vec<(String, String)> {
    use hcl::edit::expr::Expression;
    use hcl::edit::Span;
    with_edit_body(text, |body| {
        let mut found = Vec::new();
        for block in body.get_blocks("data") {
            let [kind, label] = block.labels.as_slice() else {
                continue;
            };
            if kind.as_str() != "terraform_remote_state" {
                continue;
            }
            let http = block
                .body
                .get_attribute("backend")
                .is_some_and(|a| matches!(&a.value, Expression::String(s) if s.as_str() == "http"));
            let config = block
                .body
                .get_attribute("config")
                .and_then(|a| a.value.span())
                .and_then(|span| text.get(span));
            if let (true, Some(config)) = (http, config) {
                found.push((label.as_str().to_string(), config.to_string()));
            }
        }
        found
    })
    .unwrap_or_default()
}

/// The blocks of a `.tf.json` file (each level an object or a list of objects), their `config`
/// turned into the HCL expression it means (a JSON string is a template, as in HCL).
fn json_blocks(text: &str) -> Vec<(String, String)> {
    use serde_json::Value;
    fn each(v: Option<&Value>) -> Vec<&Value> {
        match v {
            Some(Value::Array(items)) => items.iter().collect(),
            Some(v) => vec![v],
            None => Vec::new(),
        }
    }
    let Ok(v) = serde_json::from_str::<Value>(text) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for data in each(v.get("data")) {
        for states in each(data.get("terraform_remote_state")) {
            for (label, blocks) in states.as_object().into_iter().flatten() {
                for block in each(Some(blocks)) {
                    let http = block.get("backend").and_then(Value::as_str) == Some("http");
                    if let (true, Some(config)) = (http, block.get("config")) {
                        found.push((label.clone(), json_as_hcl(config)));
                    }
                }
            }
        }
    }
    found
}

/// A JSON value of a `.tf.json` file as the HCL expression it means: strings stay templates.
fn json_as_hcl(v: &serde_json::Value) -> String {
    use serde_json::Value;
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => template_string(s),
        Value::Array(items) => format!(
            "[{}]",
            items.iter().map(json_as_hcl).collect::<Vec<_>>().join(", ")
        ),
        Value::Object(map) => format!(
            "{{ {} }}",
            map.iter()
                .map(|(k, v)| format!("{} = {}", hcl_string(k), json_as_hcl(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// `s` as a quoted HCL template: its interpolations kept, quotes, backslashes and control
/// characters escaped.
fn template_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `s` as a quoted HCL string of exactly its characters: no interpolation.
pub fn hcl_string(s: &str) -> String {
    template_string(s).replace("${", "$${").replace("%{", "%%{")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nested(case: &str, d: usize) -> String {
        let expr = match case {
            "list" => format!("{}1{}", "[".repeat(d), "]".repeat(d)),
            "paren" => format!("{}1{}", "(".repeat(d), ")".repeat(d)),
            "not" => format!("{}true", "!".repeat(d)),
            "neg" => format!("{}1", "- ".repeat(d)),
            "cond" => format!("{}1", "a ? 1 : ".repeat(d)),
            "plus" => format!("1{}", " + 1".repeat(d)),
            "lines" => format!("(1{})", "\n + 1".repeat(d)),
            "tmpl" => format!("{}x{}", "\"${".repeat(d), "}\"".repeat(d)),
            "heredoc" => format!("<<EOT\n${{{}1{}}}\nEOT", "[".repeat(d), "]".repeat(d)),
            "obj" => format!("{}1{}", "{a=".repeat(d), "}".repeat(d)),
            "call" => format!("{}1{}", "f(".repeat(d), ")".repeat(d)),
            "hidden" => format!("{}1{}", "[\"]\", ".repeat(d), "]".repeat(d)),
            "block" => return format!("{}{}", "a {\n".repeat(d), "}\n".repeat(d)),
            _ => unreachable!(),
        };
        format!("x = {expr}\n")
    }

    const CASES: [&str; 13] = [
        "list", "paren", "not", "neg", "cond", "plus", "lines", "tmpl", "heredoc", "obj", "call",
        "hidden", "block",
    ];

    #[test]
    fn text_that_would_overflow_the_parser_is_refused_unparsed_and_the_rest_parses() {
        // Each of these overflowed a 2 MiB stack (the blocking threads' own) a thousand deep,
        // aborting the process; refused now, whatever the construct.
        for case in CASES {
            let deep = nested(case, 20_000);
            assert!(
                matches!(with_body(&deep, |_| ()), Err(HclError::TooDeep { .. })),
                "{case} 20000 deep"
            );
        }
        // Within the bound each parses, on the parser's own thread.
        for case in CASES {
            let text = nested(case, 100);
            assert_eq!(depth(&text), Ok(()), "{case} 100 deep");
            assert_eq!(with_body(&text, |_| ()), Ok(()), "{case} 100 deep parses");
        }
    }

    #[test]
    fn real_configuration_is_far_from_the_bound() {
        let text = r##"
# a comment with [[[[ and (((( and !!!! in it
/* a block comment ((((( */
terraform {
  backend "http" {}
}
locals {
  names = ["a", "b", "c"]
  msg   = "x ${join(", ", [for n in local.names : upper(n) if n != "b"])} ((( "
  doc   = <<-EOT
    ${local.msg} [[[ ((( !!!
    EOT
  ok = var.a > 1 && var.b < 2 || !var.c ? "yes" : "no"
}
module "vms" {
  source   = "./modules/vms"
  for_each = { for k, v in var.vms : k => v if v.enabled }
}
"##;
        assert_eq!(depth(text), Ok(()));
        let blocks = with_body(text, |b| b.blocks().count()).unwrap();
        assert_eq!(blocks, 3);
        // Many values one after another are no nesting.
        let long: String = (0..50_000)
            .map(|i| format!("v{i} = [{i}, {i} + 1]\n"))
            .collect();
        assert_eq!(depth(&format!("locals {{\n{long}}}\n")), Ok(()));
        assert_eq!(with_body("x = [", |_| ()), Err(HclError::Syntax));
    }
}
