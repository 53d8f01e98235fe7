//! A plan note (GitLab-flavoured Markdown) as safe HTML for the run pages: rendered with comrak
//! the way GitLab renders notes (tables, `<details>`, fenced code, task lists, autolinks), then
//! sanitised with ammonia so nothing in a plan can add markup, script or a dangerous link.

use std::collections::HashSet;

/// The note's Markdown as sanitised HTML.
pub fn note_to_html(markdown: &str) -> String {
    let mut options = comrak::Options::default();
    options.extension.table = true;
    options.extension.strikethrough = true;
    options.extension.autolink = true;
    options.extension.tasklist = true;
    // The note carries raw HTML GitLab allows (<details>, <summary>, <sub>, <code>); it is let
    // through here and everything unsafe is removed by the sanitiser below.
    options.render.r#unsafe = true;
    let html = comrak::markdown_to_html(markdown, &options);
    sanitize(&html)
}

/// ammonia's conservative defaults (no script, style, event handlers, forms, or `javascript:`
/// URLs; comments dropped), links limited to http(s) and mailto and opened without a referrer.
pub fn sanitize(html: &str) -> String {
    let schemes: HashSet<&str> = ["http", "https", "mailto"].into_iter().collect();
    ammonia::Builder::default()
        .url_schemes(schemes)
        .link_rel(Some("noopener noreferrer nofollow"))
        .rm_tags(["img"])
        .add_tag_attributes("code", ["class"])
        .add_tag_attributes("pre", ["lang"])
        .allowed_classes(Default::default())
        .clean(html)
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }

    #[test]
    fn hostile_values_are_inert() {
        let md = "<script>alert(1)</script>\n\n[x](javascript:alert(2)) <img src=x onerror=alert(3)> <a href=\"javascript:alert(4)\" onclick=\"alert(5)\">y</a> <iframe src=\"https://evil.example\"></iframe> <style>body{}</style> <form action=\"https://evil.example\"><input></form>\n";
        let html = note_to_html(md);
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
