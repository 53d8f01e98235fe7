//! A plan note (GitLab-flavoured Markdown) as safe HTML for the run pages: rendered with comrak
//! the way GitLab renders notes (tables, `<details>`, fenced code, task lists, autolinks), then
//! sanitised with ammonia so nothing in a plan can add markup, script or a dangerous link.

use std::collections::HashSet;

/// The note's Markdown as sanitised HTML, made inert first as it is when posted
/// ([`crate::core::defuse`]: an unclosed `<!--` hides nothing here either).
pub fn note_to_html(markdown: &str) -> String {
    let markdown = &*crate::core::defuse::defuse(markdown);
    let mut options = comrak::Options::default();
    options.extension.table = true;
    options.extension.strikethrough = true;
    options.extension.autolink = true;
    options.extension.tasklist = true;
    // The note carries raw HTML GitLab allows (<details>, <summary>, <sub>, <code>); it is let
    // through here and everything unsafe is removed by the sanitiser below.
    options.render.r#unsafe = true;
    let mut plugins = comrak::options::Plugins::default();
    plugins.render.codefence_syntax_highlighter = Some(&DiffLines);
    let html = comrak::markdown_to_html_with_plugins(markdown, &options, &plugins);
    sanitize(&html)
}

/// A one-line text (a run's summary, an error) as HTML: escaped, with its `code spans` as
/// `<code>` — what a reader of the run page sees instead of raw backticks.
pub fn inline_code_to_html(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    let mut parts = text.split('`').peekable();
    let mut in_code = false;
    while let Some(part) = parts.next() {
        // An unpaired last backtick stays a backtick.
        let last = parts.peek().is_none();
        if in_code && !last {
            out.push_str("<code>");
            let _ = escape(&mut out, part);
            out.push_str("</code>");
        } else {
            if in_code {
                out.push('`');
            }
            let _ = escape(&mut out, part);
        }
        in_code = !in_code;
    }
    out
}

/// Colours the lines of ```diff blocks the way GitLab does: `+` added, `-` removed, `~` changed
/// (planbot's diffs), everything else as context. Other blocks are only escaped.
struct DiffLines;

fn escape(out: &mut dyn std::fmt::Write, text: &str) -> std::fmt::Result {
    for c in text.chars() {
        match c {
            '&' => out.write_str("&amp;")?,
            '<' => out.write_str("&lt;")?,
            '>' => out.write_str("&gt;")?,
            '"' => out.write_str("&quot;")?,
            c => out.write_char(c)?,
        }
    }
    Ok(())
}

fn open_tag(
    out: &mut dyn std::fmt::Write,
    tag: &str,
    attributes: std::collections::HashMap<&'static str, std::borrow::Cow<'_, str>>,
) -> std::fmt::Result {
    write!(out, "<{tag}")?;
    let mut attributes: Vec<_> = attributes.into_iter().collect();
    attributes.sort();
    for (k, v) in attributes {
        write!(out, " {k}=\"")?;
        escape(out, &v)?;
        out.write_str("\"")?;
    }
    out.write_str(">")
}

impl comrak::adapters::SyntaxHighlighterAdapter for DiffLines {
    fn write_highlighted(
        &self,
        out: &mut dyn std::fmt::Write,
        lang: Option<&str>,
        code: &str,
    ) -> std::fmt::Result {
        if lang != Some("diff") {
            return escape(out, code);
        }
        for line in code.split_inclusive('\n') {
            let class = match line.chars().next() {
                Some('+') => "diff-add",
                Some('-') => "diff-del",
                Some('~') => "diff-chg",
                _ => {
                    escape(out, line)?;
                    continue;
                }
            };
            write!(out, "<span class=\"{class}\">")?;
            escape(out, line)?;
            out.write_str("</span>")?;
        }
        Ok(())
    }

    fn write_pre_tag(
        &self,
        out: &mut dyn std::fmt::Write,
        attributes: std::collections::HashMap<&'static str, std::borrow::Cow<'_, str>>,
    ) -> std::fmt::Result {
        open_tag(out, "pre", attributes)
    }

    fn write_code_tag(
        &self,
        out: &mut dyn std::fmt::Write,
        attributes: std::collections::HashMap<&'static str, std::borrow::Cow<'_, str>>,
    ) -> std::fmt::Result {
        open_tag(out, "code", attributes)
    }
}

/// ammonia's conservative defaults (no script, style, event handlers, forms, or `javascript:`
/// URLs; comments dropped), links limited to http(s) and mailto and opened without a referrer.
pub fn sanitize(html: &str) -> String {
    let schemes: HashSet<&str> = ["http", "https", "mailto"].into_iter().collect();
    ammonia::Builder::default()
        .url_schemes(schemes)
        .link_rel(Some("noopener noreferrer nofollow"))
        .rm_tags(["img"])
        .add_tag_attributes("pre", ["lang"])
        .add_allowed_classes("span", ["diff-add", "diff-del", "diff-chg"])
        .clean(html)
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unclosed_comment_hides_nothing() {
        let html = note_to_html("### plan\n\n<!--\n\n- `vm` will be **destroyed**\n");
        assert!(html.contains("destroyed"), "{html}");
    }

    #[test]
    fn a_summary_shows_its_code_spans_as_code_and_escapes_the_rest() {
        assert_eq!(
            inline_code_to_html("the root directory `core` does not exist at <abc>"),
            "the root directory <code>core</code> does not exist at &lt;abc&gt;"
        );
        assert_eq!(
            inline_code_to_html("`<script>` and an odd ` left"),
            "<code>&lt;script&gt;</code> and an odd ` left"
        );
    }

    #[test]
    fn tables_details_and_code_render_like_gitlab() {
        let md = "### Plan\n\n| root | add |\n|---|---:|\n| `dns` | 2 |\n\n<details><summary><code>-/+ vm</code> — replace</summary>\n\n```diff\n+ a\n- b\n```\n</details>\n\n<sub>fingerprint `abc`</sub>\n";
        let html = note_to_html(md);
        assert!(html.contains("<table>"), "{html}");
        assert!(html.contains("<td><code>dns</code></td>"), "{html}");
        assert!(
            html.contains("<details><summary><code>-/+ vm</code> — replace</summary>"),
            "{html}"
        );
        assert!(
            html.contains("<sub>fingerprint <code>abc</code></sub>"),
            "{html}"
        );
        assert!(!html.contains("|---|"), "{html}");
        assert!(
            html.contains(
                "<span class=\"diff-add\">+ a\n</span><span class=\"diff-del\">- b\n</span>"
            ),
            "{html}"
        );
    }

    #[test]
    fn hostile_values_are_inert() {
        let md = "<script>alert(1)</script>\n\n[x](javascript:alert(2)) <img src=x onerror=alert(3)> <a href=\"javascript:alert(4)\" onclick=\"alert(5)\">y</a> <iframe src=\"https://evil.example\"></iframe> <style>body{}</style> <form action=\"https://evil.example\"><input></form>\n";
        let html = note_to_html(md);
        let fenced = note_to_html(
            "```diff\n+ <script>x</script>\n```\n<span class=\"diff-add\" onclick=\"y\">z</span>\n",
        );
        assert!(!fenced.contains("<script"), "{fenced}");
        assert!(!fenced.contains("onclick"), "{fenced}");
        for bad in [
            "<script",
            "javascript:",
            "onerror",
            "onclick",
            "<img",
            "<iframe",
            "<style",
            "<form",
            "<input",
            "alert(1)",
        ] {
            assert!(!html.contains(bad), "{bad} survived: {html}");
        }
    }
}
