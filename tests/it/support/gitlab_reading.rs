//! How GitLab reads a text planbot posts: what it acts on (quick actions, mass mentions, an
//! unclosed HTML comment; the fake GitLab checks every note, issue and status with it), and
//! what a reader of the rendered note sees ([`reading`]).
//!
//! Quick actions: a port of the rule in GitLab's `lib/gitlab/quick_actions/extractor.rb` (read
//! in gitlabhq/gitlabhq, and in an older snapshot). GitLab deletes every `\r`, then scans the
//! text once from the start with one regular expression (Ruby: `^`/`$` at line ends, `.`
//! matching line feeds too, case-insensitive). At each position the first of these that matches
//! wins, and the scan goes on after it:
//!
//! 1. a code block: a line that starts with three backticks, lazily through the next line that
//!    is exactly three backticks;
//! 2. "inline code" (newer GitLab only): from a line start, greedily through a backtick, then at
//!    least one character, lazily through a backtick that ends a line;
//! 3. an HTML block: a line that is one tag, lazily through a line that is one closing tag;
//! 4. a quote block: `>>>`, lazily through the next `>>>` line;
//! 5. a command: `/` at a line start, a command name, optionally a space and an argument to the
//!    end of the line, then optional whitespace and a line feed (or the end).
//!
//! Only 5 is executed (and removed from the stored text). The names are GitLab's list of quick
//! actions; here any name of letters, digits and `_` counts, a superset, so a quick action a
//! later GitLab adds is covered too. A command found by either version of the rule (with or
//! without 2) counts: planbot must be safe on old and new GitLab alike.
//!
//! Mass mentions: `@all` or `@here` in any case, not followed by more of a user name.
//! Comments: an `<!--` after which no `-->` follows hides the rest from the reader.

use regex::Regex;
use std::sync::LazyLock;

/// One quick action GitLab would run: its name (lower case) and argument.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuickAction {
    pub name: String,
    pub arg: Option<String>,
}

impl std::fmt::Display for QuickAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.arg {
            Some(a) => write!(f, "/{} {a}", self.name),
            None => write!(f, "/{}", self.name),
        }
    }
}

/// Ruby's `\s`, not Rust's Unicode one.
const SPACE: &str = r"[\t\n\x0B\x0C\r\x20]";

fn rule(with_inline_code: bool) -> Regex {
    let inline_code = if with_inline_code {
        r"| (?P<inline_code> ^.*`\n* .+? \n*`$ )"
    } else {
        ""
    };
    let pattern = format!(
        r"(?smix)
          (?P<code> ^``` .+? \n```$ )
          {inline_code}
        | (?P<html> ^<[^>]+?>\n .+? \n</[^>]+?>$ )
        | (?P<quote> ^>>> .+? \n>>>$ )
        | (?: ^/ (?P<cmd>[a-z0-9_]+) (?: \x20 (?P<arg>[^\n]*) )? (?: {SPACE}*\n | $ ) )"
    );
    Regex::new(&pattern).expect("the ported rule compiles")
}

static NEWER: LazyLock<Regex> = LazyLock::new(|| rule(true));
static OLDER: LazyLock<Regex> = LazyLock::new(|| rule(false));

fn commands(rule: &Regex, text: &str) -> Vec<(usize, QuickAction)> {
    rule.captures_iter(text)
        .filter_map(|c| {
            let cmd = c.name("cmd")?;
            let arg = c
                .name("arg")
                .map(|a| a.as_str().trim().to_string())
                .filter(|a| !a.is_empty());
            Some((
                cmd.start(),
                QuickAction {
                    name: cmd.as_str().to_ascii_lowercase(),
                    arg,
                },
            ))
        })
        .collect()
}

/// Every quick action GitLab (older or newer) would run in `text`.
pub fn quick_actions(text: &str) -> Vec<QuickAction> {
    let text = text.replace('\r', "");
    let mut found = commands(&NEWER, &text);
    for (at, qa) in commands(&OLDER, &text) {
        if !found.iter().any(|(a, _)| *a == at) {
            found.push((at, qa));
        }
    }
    found.sort_by_key(|(at, _)| *at);
    found.into_iter().map(|(_, qa)| qa).collect()
}

/// The text as GitLab stores it after running its quick actions (newer rule): each command line
/// removed.
pub fn without_quick_actions(text: &str) -> String {
    let text = text.replace('\r', "");
    NEWER
        .replace_all(&text, |c: &regex::Captures| {
            if c.name("cmd").is_some() {
                String::new()
            } else {
                c[0].to_string()
            }
        })
        .trim_end()
        .to_string()
}

/// `@all` / `@here` mentions in `text`.
pub fn mass_mentions(text: &str) -> Vec<String> {
    static MENTION: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r"(?i)@(all|here)([A-Za-z0-9_-]|\.[A-Za-z0-9_-])?").unwrap());
    MENTION
        .captures_iter(text)
        .filter(|c| c.get(2).is_none())
        .map(|c| c[0].to_string())
        .collect()
}

/// Whether an `<!--` in `text` is never closed.
pub fn unclosed_comment(text: &str) -> bool {
    let mut rest = text;
    while let Some(open) = rest.find("<!--") {
        match rest[open + 4..].find("-->") {
            Some(close) => rest = &rest[open + 4 + close + 3..],
            None => return true,
        }
    }
    false
}

/// Everything GitLab would act on in `text`, in words (empty when nothing).
pub fn hazards(text: &str) -> Vec<String> {
    let mut out: Vec<String> = quick_actions(text)
        .into_iter()
        .map(|qa| format!("quick action `{qa}`"))
        .collect();
    out.extend(
        mass_mentions(text)
            .into_iter()
            .map(|m| format!("mass mention `{m}`")),
    );
    if unclosed_comment(text) {
        out.push("an HTML comment that is never closed".into());
    }
    out
}

/// What a reader of a note sees once GitLab renders it (CommonMark with GitLab's extensions).
#[derive(Debug, Default)]
pub struct Reading {
    /// The headings, as text.
    pub headings: Vec<String>,
    /// Every visible text and code, in order (zero-width spaces removed).
    pub visible: String,
    /// The raw HTML the note carries (tags and comments), in order.
    pub html: Vec<String>,
}

/// Parse `md` as GitLab does and say what a reader sees.
pub fn reading(md: &str) -> Reading {
    use comrak::nodes::NodeValue;
    let options = planbot::core::markdown::gitlab_flavour();
    let arena = comrak::Arena::new();
    let root = comrak::parse_document(&arena, md, &options);
    let mut out = Reading::default();
    for node in root.descendants() {
        match &node.data.borrow().value {
            NodeValue::Heading(_) => {
                let mut text = String::new();
                for d in node.descendants() {
                    match &d.data.borrow().value {
                        NodeValue::Text(t) => text.push_str(t),
                        NodeValue::Code(c) => text.push_str(&c.literal),
                        _ => {}
                    }
                }
                out.headings.push(text.replace('\u{200B}', ""));
            }
            NodeValue::HtmlInline(h) => {
                out.html.push(h.trim().to_string());
                out.visible.push_str(&html_text(h));
            }
            NodeValue::HtmlBlock(h) => {
                out.html.push(h.literal.trim().to_string());
                out.visible.push_str(&html_text(&h.literal));
            }
            NodeValue::Text(t) => out.visible.push_str(t),
            NodeValue::Code(c) => out.visible.push_str(&c.literal),
            NodeValue::CodeBlock(c) => out.visible.push_str(&c.literal),
            NodeValue::SoftBreak | NodeValue::LineBreak => out.visible.push('\n'),
            _ => {}
        }
        if matches!(
            node.data.borrow().value,
            NodeValue::Paragraph | NodeValue::Heading(_)
        ) {
            out.visible.push('\n');
        }
    }
    out.visible = out.visible.replace('\u{200B}', "");
    out
}

/// The text a browser shows of a piece of raw HTML: no comments (an unclosed one hides all
/// that follows), no tags, entities decoded.
fn html_text(html: &str) -> String {
    static HIDDEN: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r"(?s)<!--.*?(-->|\z)|<[^>]*>").unwrap());
    HIDDEN
        .replace_all(html, "")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&#124;", "|")
        .replace("&#91;", "[")
        .replace("&#93;", "]")
        .replace("&#96;", "`")
        .replace("&amp;", "&")
}

/// Whether a piece of raw HTML of a note holds only the tags planbot writes (the folding tags,
/// code, small print, emphasis) and its own one-line markers; text between them is fine.
pub fn is_planbots_html(html: &str) -> bool {
    const TAGS: &[&str] = &[
        "<details>",
        "</details>",
        "<summary>",
        "</summary>",
        "<code>",
        "</code>",
        "<sub>",
        "</sub>",
        "<em>",
        "</em>",
    ];
    static TAG: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"(?s)<!--.*?-->|<[^>]*>?").unwrap());
    TAG.find_iter(html).all(|t| {
        let t = t.as_str();
        TAGS.contains(&t)
            || (t.starts_with("<!-- planbot:") && t.ends_with("-->") && !t.contains('\n'))
    })
}
