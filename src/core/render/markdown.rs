//! Markdown/HTML safety for values shown in the note: fences, code spans, escaping, marker neutralising.

use std::borrow::Cow;

/// The zero-width space put inside `<!--` and `-->` so a value can never open/close an HTML comment
/// or fake planbot's hidden marker. It renders as nothing.
const ZWSP: char = '\u{200B}';

/// Break every `<!--` and `-->` in `text` (values, error texts, lines of files).
pub fn neutralise(text: &str) -> Cow<'_, str> {
    if !text.contains("<!--") && !text.contains("-->") {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    let bytes = text.as_bytes();
    let mut i = 0;
    let mut start = 0;
    while i < bytes.len() {
        if bytes[i..].starts_with(b"<!--") {
            out.push_str(&text[start..i]);
            out.push_str("<!");
            out.push(ZWSP);
            out.push_str("--");
            i += 4;
            start = i;
        } else if bytes[i..].starts_with(b"-->") {
            out.push_str(&text[start..i]);
            out.push_str("--");
            out.push(ZWSP);
            out.push('>');
            i += 3;
            start = i;
        } else {
            i += 1;
        }
    }
    out.push_str(&text[start..]);
    Cow::Owned(out)
}

/// The longest run of backticks in `text`.
pub fn longest_backtick_run(text: &str) -> usize {
    let mut best = 0;
    let mut run = 0;
    for b in text.bytes() {
        if b == b'`' {
            run += 1;
            best = best.max(run);
        } else {
            run = 0;
        }
    }
    best
}

/// A code fence longer than any backtick run inside `body` (at least three backticks).
pub fn fence_for(body: &str) -> String {
    "`".repeat((longest_backtick_run(body) + 1).max(3))
}

/// HTML-escape text for `<summary>`, `<code>` and other HTML contexts.
pub fn html_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            '\n' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// An inline Markdown code span that no backtick, newline or comment inside `text` can break.
pub fn code_span(text: &str) -> String {
    let text = neutralise(text).replace(['\n', '\r'], " ");
    let delim = "`".repeat(longest_backtick_run(&text) + 1);
    let pad = if text.starts_with('`') || text.ends_with('`') {
        " "
    } else {
        ""
    };
    format!("{delim}{pad}{text}{pad}{delim}")
}

/// `<code>` for a GFM table cell: HTML-escaped, `|` as an entity so it cannot split the row.
pub fn table_code(text: &str) -> String {
    format!("<code>{}</code>", html_escape(text).replace('|', "&#124;"))
}

/// Plain text inside a Markdown paragraph or list item: no HTML, no line breaks.
pub fn inline_text(text: &str) -> String {
    html_escape(text)
}

/// Plain text inside a GFM table cell.
pub fn table_text(text: &str) -> String {
    html_escape(text).replace('|', "&#124;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn neutralises_comment_openers_and_closers() {
        let n = neutralise("a <!-- planbot:mr-note v1 --> b");
        assert!(!n.contains("<!--") && !n.contains("-->"), "{n}");
        assert_eq!(n.replace(ZWSP, ""), "a <!-- planbot:mr-note v1 --> b");
        assert!(matches!(neutralise("plain"), Cow::Borrowed(_)));
    }

    #[test]
    fn fences_and_spans_outgrow_backtick_runs() {
        assert_eq!(fence_for("no ticks"), "```");
        assert_eq!(fence_for("a ```` b"), "`````");
        assert_eq!(code_span("a`b"), "``a`b``");
        assert_eq!(code_span("`x`"), "`` `x` ``");
        assert_eq!(table_code("a|b<c>"), "<code>a&#124;b&lt;c&gt;</code>");
    }
}
