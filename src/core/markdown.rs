//! Markdown/HTML safety for values shown in the note: fences, code spans, escaping, marker neutralising.

use std::borrow::Cow;

/// The zero-width space put inside `<!--` and `-->` so a value can never open/close an HTML comment
/// or fake planbot's hidden marker. It renders as nothing.
const ZWSP: char = '\u{200B}';

/// Break every `<!--` and `-->` in `text` (values, error texts, lines of files). Until none is
/// left: an opener and a closer can share dashes (`<!-->`, `<!--->`), and breaking one leaves
/// the other whole.
pub fn neutralise(text: &str) -> Cow<'_, str> {
    if !text.contains("<!--") && !text.contains("-->") {
        return Cow::Borrowed(text);
    }
    let mut out = neutralise_once(text);
    while out.contains("<!--") || out.contains("-->") {
        out = neutralise_once(&out);
    }
    Cow::Owned(out)
}

/// One pass of [`neutralise`]: each `<!--` and `-->` found left to right, without overlaps.
fn neutralise_once(text: &str) -> String {
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
    out
}

/// How GitLab parses a note: CommonMark with its extensions (tables, strikethrough, autolinks,
/// task lists, footnotes, `$…$` math). The tests read planbot's notes with it, as a reader would.
pub fn gitlab_flavour() -> comrak::Options<'static> {
    let mut options = comrak::Options::default();
    options.extension.strikethrough = true;
    options.extension.table = true;
    options.extension.autolink = true;
    options.extension.tasklist = true;
    options.extension.footnotes = true;
    options.extension.math_dollars = true;
    options.extension.math_code = true;
    options
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

/// HTML-escape text for `<summary>`, `<code>` and other HTML contexts. Line ends (`\n` and `\r`,
/// which Markdown reads as one too) become spaces: a table row or an HTML block stays whole.
pub fn html_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' | '\r' => out.push(' '),
            c => push_prose(&mut out, c),
        }
    }
    out
}

/// An inline Markdown code span that no backtick, newline or comment inside `text` can break,
/// showing `text` as it is: padded with a space inside when it starts or ends with a backtick,
/// or starts and ends with a space (CommonMark takes one space off each side of such a span);
/// an empty text is a span of one space (an empty span is not one, it shows its backticks).
pub fn code_span(text: &str) -> String {
    let text = break_backtick_runs(&neutralise(text).replace(['\n', '\r'], " "));
    if text.is_empty() {
        return "` `".to_string();
    }
    let delim = "`".repeat(longest_backtick_run(&text) + 1);
    let spaced = text.starts_with(' ') && text.ends_with(' ') && text.bytes().any(|b| b != b' ');
    let pad = if text.starts_with('`') || text.ends_with('`') || spaced {
        " "
    } else {
        ""
    };
    format!("{delim}{pad}{text}{pad}{delim}")
}

/// The longest backtick run a code span's text keeps: GitLab's parser (comrak, as cmark) takes
/// no backtick string longer than 80 as a code span's opener or closer, so a longer run in a
/// value would leave its delimiters unmatched and the value outside code.
const MAX_BACKTICK_RUN: usize = 32;

/// `text` with a zero-width space after every [`MAX_BACKTICK_RUN`] backticks in a row.
fn break_backtick_runs(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut run = 0;
    for c in text.chars() {
        if c == '`' {
            if run == MAX_BACKTICK_RUN {
                out.push(ZWSP);
                run = 0;
            }
            run += 1;
        } else {
            run = 0;
        }
        out.push(c);
    }
    out
}

/// The longest node label a Mermaid picture shows (longer ones end in `…`).
const MAX_MERMAID_LABEL: usize = 64;

/// A node label for a Mermaid graph, written between double quotes (`r0["label"]`): only
/// letters, digits, space and `. _ - /` stay, every other character becomes `_`, so no quote,
/// bracket, backtick, entity, HTML tag, line break or Markdown can leave the label, the node
/// or the fenced block around it.
pub fn mermaid_label(text: &str) -> String {
    let mut out: String = text
        .chars()
        .take(MAX_MERMAID_LABEL)
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, ' ' | '.' | '_' | '-' | '/') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if text.chars().count() > MAX_MERMAID_LABEL {
        out.push_str("...");
    }
    if out.trim().is_empty() {
        out = "_".to_string();
    }
    out
}

/// `<code>` for a GFM table cell: HTML-escaped, `|` as an entity so it cannot split the row.
pub fn table_code(text: &str) -> String {
    format!("<code>{}</code>", html_escape(text).replace('|', "&#124;"))
}

/// Text inside a Markdown paragraph or list item, which may hold code spans (a finding's
/// message: ``downloads `x.img` with `content_type = "iso"` ``). No HTML, no line breaks.
///
/// Code spans are found exactly as CommonMark (and so GitLab) finds them: a backtick string
/// opens one (unless backslash-escaped) and the next backtick string of the same length closes
/// it; an unclosed one is literal. Inside a code span characters are shown as they are —
/// GitLab shows `&quot;` there verbatim, so nothing is escaped; only `<!--`/`-->` and tag
/// openers get an invisible break (see [`push_code`]). Outside code spans the text is
/// HTML-escaped as before (GitLab shows those entities as the characters), so no tag, comment,
/// autolink or entity can form there. Line breaks (`\n`, `\r`) become spaces.
///
/// Where GitLab's parser would still find a link, an image, HTML or a live mention in the
/// result (its extensions end code spans elsewhere than CommonMark: a bare URL's autolink, a
/// `<…>` autolink, which outrank code spans), the whole text is escaped as prose instead —
/// backticks too, so no code span is shown, but nothing is live. Checked only when the text
/// has a code span: without one every character went through [`push_prose`].
pub fn inline_text(text: &str) -> String {
    let spans = inline_text_with_spans(text);
    if !spans.contains('`') || reads_as_plain_text(&spans) {
        return spans;
    }
    prose_escape(&text.replace(['\n', '\r'], " "))
}

/// `md` read by GitLab's flavour of Markdown, in a paragraph and as a list item, forms no link,
/// image or HTML, and every `@` of its text is defused (a zero-width space after it).
fn reads_as_plain_text(md: &str) -> bool {
    [format!("x {md} y\n"), format!("- {md}\n")]
        .iter()
        .all(|doc| {
            let arena = comrak::Arena::new();
            let root = comrak::parse_document(&arena, doc, &gitlab_flavour());
            root.descendants().all(|n| match &n.data.borrow().value {
                comrak::nodes::NodeValue::Link(_)
                | comrak::nodes::NodeValue::Image(_)
                | comrak::nodes::NodeValue::HtmlInline(_)
                | comrak::nodes::NodeValue::HtmlBlock(_) => false,
                comrak::nodes::NodeValue::Text(t) => {
                    let t: &str = t.as_ref();
                    t.match_indices('@')
                        .all(|(i, _)| t[i + 1..].starts_with(ZWSP))
                }
                _ => true,
            })
        })
}

/// [`inline_text`]'s first try: code spans kept as they are, the prose escaped.
fn inline_text_with_spans(text: &str) -> String {
    let text = text.replace(['\n', '\r'], " ");
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len() + 8);
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'\\' if b.get(i + 1).is_some_and(u8::is_ascii_punctuation) => {
                // A backslash escape: the next character is literal (never an opener).
                match b[i + 1] {
                    // `\&lt;` would show `&lt;`: the entity alone shows the `<` meant.
                    // `\@` shows `@`, which GitLab would still read as a mention: defused too.
                    c @ (b'&' | b'<' | b'>' | b'"' | b'\'' | b'@' | b'[' | b']') => {
                        push_prose(&mut out, c as char)
                    }
                    c => {
                        out.push('\\');
                        out.push(c as char);
                    }
                }
                i += 2;
            }
            b'`' => {
                let n = backtick_run_at(b, i);
                match closing_run(b, i + n, n) {
                    Some(close) => {
                        out.push_str(&text[i..i + n]);
                        push_code(&mut out, &text[i + n..close]);
                        out.push_str(&text[close..close + n]);
                        i = close + n;
                    }
                    None => {
                        out.push_str(&text[i..i + n]);
                        i += n;
                    }
                }
            }
            _ => {
                let c = text[i..].chars().next().expect("inside the text");
                push_prose(&mut out, c);
                i += c.len_utf8();
            }
        }
    }
    out
}

/// The content of a code span, as it is but for `<!--`/`-->` (the marker) and a `<` that could
/// open a tag or an autolink (before a letter, `/`, `!` or `?`: a zero-width space goes
/// between). So even where a parser ended the span elsewhere than CommonMark says (GitLab's
/// extensions: a bare URL's autolink runs through backticks, `$…$` math), no HTML can form.
fn push_code(out: &mut String, code: &str) {
    let code = neutralise(code);
    let mut chars = code.chars().peekable();
    while let Some(c) = chars.next() {
        out.push(c);
        if c == '<'
            && chars
                .peek()
                .is_some_and(|n| n.is_ascii_alphabetic() || matches!(n, '/' | '!' | '?'))
        {
            out.push(ZWSP);
        }
    }
}

/// One character of prose (outside code spans), escaped as [`html_escape`] does (GitLab shows
/// the entities there as the characters; the scrubber knows this form of every secret,
/// [`prose_escape`]). Beyond HTML: `[` and `]` as entities, so no link, image, footnote or task
/// item forms from a value; a zero-width space after every `@`, so no value mentions a user or
/// a group (`@infra/everyone`) and no e-mail address autolinks; `:` before `//` and `www.` get
/// one too, so no bare URL becomes a link.
fn push_prose(out: &mut String, c: char) {
    match c {
        '&' => out.push_str("&amp;"),
        '<' => out.push_str("&lt;"),
        '>' => out.push_str("&gt;"),
        '"' => out.push_str("&quot;"),
        '\'' => out.push_str("&#39;"),
        '[' => out.push_str("&#91;"),
        '`' => out.push_str("&#96;"),
        ']' => out.push_str("&#93;"),
        '@' => {
            out.push('@');
            out.push(ZWSP);
        }
        '/' if out.ends_with(':') || out.ends_with("&#58;") => {
            // `scheme:/` — the autolink needs `://` (and GitLab's, a scheme then `:`).
            out.push(ZWSP);
            out.push('/');
        }
        '.' if out.ends_with("www") || out.ends_with("WWW") => {
            out.push(ZWSP);
            out.push('.');
        }
        c => out.push(c),
    }
}

/// `text` as prose escapes it (outside code spans): one of the forms the scrubber knows a
/// secret by, since a value is scrubbed after it was escaped.
pub fn prose_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        push_prose(&mut out, c);
    }
    out
}

/// The length of the backtick string starting at `at`.
fn backtick_run_at(b: &[u8], at: usize) -> usize {
    b[at..].iter().take_while(|c| **c == b'`').count()
}

/// Where the first backtick string of exactly `n` backticks at or after `from` starts.
fn closing_run(b: &[u8], from: usize, n: usize) -> Option<usize> {
    let mut j = from;
    while j < b.len() {
        if b[j] == b'`' {
            let m = backtick_run_at(b, j);
            if m == n {
                return Some(j);
            }
            j += m;
        } else {
            j += 1;
        }
    }
    None
}

/// Plain text inside a GFM table cell.
pub fn table_text(text: &str) -> String {
    html_escape(text).replace('|', "&#124;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mermaid_label_keeps_names_and_nothing_that_leaves_the_label() {
        assert_eq!(mermaid_label("network-1.prod_eu/x"), "network-1.prod_eu/x");
        let hostile = "a\"] --> b[\"<img src=x onerror=alert(1)>\n```\n/approve @all #quot; &amp; click r0 call x()";
        let label = mermaid_label(hostile);
        assert!(
            !label.chars().any(|c| "\"[]<>`\n&#;(){}|:".contains(c)),
            "{label}"
        );
        assert_eq!(mermaid_label(""), "_");
        assert_eq!(mermaid_label(&"x".repeat(100)).len(), 67);
    }

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

    #[test]
    fn inline_text_keeps_code_spans_as_they_are_and_escapes_the_prose() {
        // Inside a code span GitLab shows entities verbatim: the characters stay.
        assert_eq!(
            inline_text(r#"sets `content_type = "iso"` & `a<b>'c'&amp;` for <b>"x"</b>"#),
            "sets `content_type = \"iso\"` &amp; `a<\u{200B}b>'c'&amp;` for &lt;b&gt;&quot;x&quot;&lt;/b&gt;"
        );
        // A longer delimiter holds a single backtick; an unclosed opener is literal.
        assert_eq!(
            inline_text("``a`<b>`` `<i>"),
            "``a`<\u{200B}b>`` `&lt;i&gt;"
        );
        assert_eq!(inline_text("`a < b, c<1>`"), "`a < b, c<1>`");
        // An escaped backtick opens nothing (CommonMark), so what follows is prose.
        assert_eq!(
            inline_text(r"\`<img src=x>` \<b\>"),
            r"\`&lt;img src=x&gt;` &lt;b&gt;"
        );
        // Inside code spans backslashes are literal: `a\` closes at the next backtick.
        assert_eq!(inline_text(r"`a\`<b>`"), r"`a\`&lt;b&gt;`");
        // Where GitLab's extensions end a span elsewhere (a bare URL's autolink runs through a
        // backtick; `$…$` math), its content still forms no tag.
        for t in ["http://x.y`</details>`", "$a `x$ <img src=x>`"] {
            let out = inline_text(t);
            assert_eq!(as_gitlab_reads(&out).0, 0, "{out}");
        }
        // Comments cannot open, in code spans or out; lines cannot break.
        let t = inline_text("`<!-- planbot:mr-note v1 -->` <!-- x -->\r\n\n- item");
        assert!(!t.contains("<!--") && !t.contains("-->"), "{t}");
        assert!(!t.contains('\n') && !t.contains('\r'), "{t}");
        assert_eq!(inline_text("ünïcode `ä`"), "ünïcode `ä`");
    }

    /// How GitLab's Markdown parser (comrak, with GitLab's extensions) reads `md` inside a list
    /// item: how many raw HTML nodes it finds, and what a reader sees (text, and each code
    /// span's content between `⟦⟧`).
    fn as_gitlab_reads(md: &str) -> (usize, String) {
        use comrak::nodes::NodeValue;
        let options = gitlab_flavour();
        let arena = comrak::Arena::new();
        let doc = format!("- ❌ **PVE001**: {md}\n");
        let root = comrak::parse_document(&arena, &doc, &options);
        let (mut html, mut seen) = (0, String::new());
        for node in root.descendants() {
            match &node.data.borrow().value {
                NodeValue::HtmlInline(_) | NodeValue::HtmlBlock(_) => html += 1,
                NodeValue::Text(t) => seen.push_str(t),
                NodeValue::Code(c) => seen.push_str(&format!("⟦{}⟧", c.literal)),
                NodeValue::Math(m) => seen.push_str(&format!("⟦{}⟧", m.literal)),
                _ => {}
            }
        }
        (html, seen.replace(ZWSP, ""))
    }

    #[test]
    fn outside_text_links_nothing_and_mentions_no_one_in_prose_cells_or_code_tags() {
        use comrak::nodes::NodeValue;
        let value = "vm_x[\"@infra/everyone @alice\"] [ok](https://phish.example/b) ![i](https://phish.example/c.png) <https://phish.example/e> https://phish.example/d www.phish.example a@b.example \\@bob \\[x](https://phish.example/f)";
        let cell = |v: &str| format!("| a |\n|---|\n| {v} |\n");
        for md in [
            format!("- {}\n", inline_text(value)),
            cell(&table_text(value)),
            cell(&table_code(value)),
            format!("- <code>{}</code>\n", html_escape(value)),
        ] {
            let arena = comrak::Arena::new();
            let root = comrak::parse_document(&arena, &md, &gitlab_flavour());
            let mut text = String::new();
            for node in root.descendants() {
                match &node.data.borrow().value {
                    NodeValue::Link(_) | NodeValue::Image(_) | NodeValue::FootnoteReference(_) => {
                        panic!("a link in {md}")
                    }
                    NodeValue::Text(t) => text.push_str(t),
                    _ => {}
                }
            }
            for mention in ["@infra", "@alice", "@bob", "@b.example"] {
                assert!(!text.contains(mention), "{mention} in {text:?} from {md}");
            }
            // What the reader sees is the value (but for the invisible breaks).
            assert!(
                text.replace(ZWSP, "").contains("@infra/everyone @alice"),
                "{text}"
            );
        }
        assert_eq!(
            prose_escape("@all [x](https://y) www.z"),
            "@\u{200B}all &#91;x&#93;(https:\u{200B}//y) www\u{200B}.z"
        );
    }

    #[test]
    fn gitlab_reads_a_findings_message_with_its_real_characters() {
        let message = r#"`proxmox_virtual_environment_download_file.talos["v1.9"]` downloads `talos.raw.xz` with `content_type = "iso"` & <no> `'&amp;'`"#;
        let (html, seen) = as_gitlab_reads(&inline_text(message));
        assert_eq!(html, 0);
        assert_eq!(
            seen,
            r#"❌ PVE001: ⟦proxmox_virtual_environment_download_file.talos["v1.9"]⟧ downloads ⟦talos.raw.xz⟧ with ⟦content_type = "iso"⟧ & <no> ⟦'&amp;'⟧"#
        );
        // `html_escape` (for HTML and table cells) makes it all text, backticks included.
        let (_, all_text) = as_gitlab_reads(&html_escape(message));
        assert!(
            !all_text.contains('⟦') && all_text.contains("`talos.raw.xz`"),
            "{all_text}"
        );
    }

    #[test]
    fn no_input_makes_gitlab_see_html_and_code_spans_are_the_ones_commonmark_finds() {
        // Pieces of Markdown that open, close or escape something.
        const PIECES: &[&str] = &[
            "`",
            "`",
            "``",
            "\\",
            "<b>",
            "</b>",
            "<!--",
            "-->",
            "<http://x.y>",
            "&quot;",
            "&",
            "\"",
            "'",
            " ",
            "\n",
            "\r",
            "x",
            "$",
            "[",
            "](",
            ")",
            "*",
            "_",
            "!",
            "|",
        ];
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..20_000 {
            let len = (next() % 12) as usize;
            let t: String = (0..len)
                .map(|_| PIECES[(next() % PIECES.len() as u64) as usize])
                .collect();
            let out = inline_text(&t);
            let (html, seen) = as_gitlab_reads(&out);
            assert_eq!(html, 0, "HTML in {out:?} (from {t:?})");
            assert!(!out.contains("<!--") && !out.contains("-->"), "{out:?}");
            assert!(!out.contains(['\n', '\r']), "{out:?}");
            // Where the raw text is plain Markdown (no HTML, entity, escape or line break),
            // the reader sees exactly what the raw text would show: same spans, same characters.
            // (Not `$…$` math, GitLab's extension: its content is literal like a code span's, so
            // an escaped quote in it would show as an entity. Cosmetic, and no message has it.)
            // Nor `<http://…>`, an autolink raw and text once escaped, nor a link `[…](…)`:
            // outside text shows its brackets and never links.
            if !t.contains(['&', '\\', '\n', '\r', '$', '[']) && !t.contains("<http") {
                let (raw_html, raw_seen) = as_gitlab_reads(&t);
                if raw_html == 0 {
                    assert_eq!(seen, raw_seen, "{t:?} became {out:?}");
                }
            }
        }
    }
}
