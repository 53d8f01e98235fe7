//! The plan note as a terminal shows it well: planbot's own Markdown (tables, `<details>`,
//! code spans, entities) turned into plain aligned text for `planbot plan` on a terminal.
//!
//! This reads only the shapes the note template writes (it is not a Markdown parser): fenced
//! blocks are kept verbatim without their fences, tables are aligned, `<details>` becomes a
//! `▸ summary` line, tags are dropped and entities decoded outside code blocks.

/// `markdown` (a note rendered by [`super::render_note`]) as plain text.
pub fn note_as_text(markdown: &str) -> String {
    let mut out = String::with_capacity(markdown.len());
    let mut fence: Option<String> = None;
    let mut table: Vec<Vec<String>> = Vec::new();
    for line in markdown.lines() {
        if let Some(open) = &fence {
            if line.trim_start().starts_with(open.as_str()) && line.trim() == open.as_str() {
                fence = None;
            } else {
                out.push_str("    ");
                out.push_str(line);
                out.push('\n');
            }
            continue;
        }
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            flush_table(&mut table, &mut out);
            let marker: String = trimmed
                .chars()
                .take_while(|c| *c == '`' || *c == '~')
                .collect();
            fence = Some(marker);
            continue;
        }
        if trimmed.starts_with('|') {
            if !is_separator_row(trimmed) {
                table.push(split_row(trimmed));
            }
            continue;
        }
        flush_table(&mut table, &mut out);
        if trimmed.starts_with("<!--") && trimmed.ends_with("-->") {
            continue;
        }
        if trimmed == "</details>" {
            continue;
        }
        let text = if let Some(rest) = trimmed.strip_prefix("<details><summary>") {
            format!("▸ {}", inline(rest.trim_end_matches("</summary>")))
        } else {
            let t = trimmed.trim_start_matches('#').trim_start();
            let heading = t.len() != trimmed.len();
            let t = inline(if heading { t } else { line });
            if heading {
                format!("{t}\n{}", "═".repeat(t.chars().count()))
            } else {
                t
            }
        };
        // No runs of blank lines.
        if text.is_empty() && (out.is_empty() || out.ends_with("\n\n")) {
            continue;
        }
        out.push_str(&text);
        out.push('\n');
    }
    flush_table(&mut table, &mut out);
    out.trim_end().to_string() + "\n"
}

/// One line of prose: tags dropped, `**` dropped, entities decoded, zero-width spaces gone.
fn inline(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(start) = rest.find('<') {
        out.push_str(&rest[..start]);
        let after = &rest[start..];
        let is_tag = after[1..]
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '/' || c == '!');
        match (is_tag, after.find('>')) {
            (true, Some(end)) => rest = &after[end + 1..],
            _ => {
                out.push('<');
                rest = &after[1..];
            }
        }
    }
    out.push_str(rest);
    decode_entities(&out.replace("**", "").replace('\u{200b}', ""))
}

/// The entities the Markdown escaping writes, decoded for a terminal: the named ones and every
/// numeric one (`&#91;`, `&#x27;`, …); `&amp;` last, so `&amp;lt;` reads `&lt;`.
fn decode_entities(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find('&') {
        out.push_str(&rest[..at]);
        let after = &rest[at..];
        match decode_one_entity(after) {
            Some((c, len)) => {
                out.push(c);
                rest = &after[len..];
            }
            None => {
                out.push('&');
                rest = &after[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// The character of the entity `text` starts with, and the entity's length.
fn decode_one_entity(text: &str) -> Option<(char, usize)> {
    let end = text.bytes().take(12).position(|b| b == b';')?;
    let name = &text[1..end];
    let c = match name {
        "lt" => '<',
        "gt" => '>',
        "quot" => '"',
        "amp" => '&',
        _ => {
            let digits = name.strip_prefix('#')?;
            let code = match digits.strip_prefix(['x', 'X']) {
                Some(hex) => u32::from_str_radix(hex, 16).ok()?,
                None => digits.parse::<u32>().ok()?,
            };
            char::from_u32(code)?
        }
    };
    Some((c, end + 1))
}

fn is_separator_row(row: &str) -> bool {
    row.chars().all(|c| matches!(c, '|' | '-' | ':' | ' '))
}

fn split_row(row: &str) -> Vec<String> {
    row.trim()
        .trim_start_matches('|')
        .trim_end_matches('|')
        .split('|')
        .map(|c| inline(c.trim()))
        .collect()
}

/// Print the collected table rows as aligned columns (numbers right-aligned).
fn flush_table(rows: &mut Vec<Vec<String>>, out: &mut String) {
    if rows.is_empty() {
        return;
    }
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let width = |c: usize| {
        rows.iter()
            .map(|r| r.get(c).map_or(0, |s| s.chars().count()))
            .max()
            .unwrap_or(0)
    };
    let widths: Vec<usize> = (0..columns).map(width).collect();
    for (i, row) in rows.iter().enumerate() {
        let mut line = String::new();
        for (c, w) in widths.iter().enumerate() {
            let cell = row.get(c).map(String::as_str).unwrap_or("");
            let pad = w.saturating_sub(cell.chars().count());
            let numeric = i > 0 && !cell.is_empty() && cell.chars().all(|ch| ch.is_ascii_digit());
            if c > 0 {
                line.push_str("  ");
            }
            if numeric {
                line.push_str(&" ".repeat(pad));
                line.push_str(cell);
            } else {
                line.push_str(cell);
                line.push_str(&" ".repeat(pad));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
        if i == 0 {
            let total = widths.iter().sum::<usize>() + 2 * widths.len().saturating_sub(1);
            out.push_str(&"─".repeat(total));
            out.push('\n');
        }
    }
    rows.clear();
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOTE: &str = "<!-- planbot:mr-note v1 -->\n\
### 🟢 planbot · plan for a local run · 1 root with changes\n\
\n\
| root | add | change | destroy |\n\
|---|---:|---:|---:|\n\
| <code>quickstart</code> | 4 | 10 | 0 |\n\
\n\
> - ❌ **PVE104** `x`: use `content_type = &quot;import&quot;` &amp; <b>fix</b>\n\
\n\
<details><summary><code>+ terraform_data.vm&#91;&quot;backup&quot;&#93;</code> — created</summary>\n\
\n\
```diff\n\
+ input.name = \"a &quot;b&quot; <c>\"\n\
```\n\
\n\
</details>\n\
\n\
<sub>fingerprint `95b080b11f0a` · Terraform 1.11.4</sub>\n";

    #[test]
    fn a_note_reads_as_plain_text() {
        let text = note_as_text(NOTE);
        let title = "🟢 planbot · plan for a local run · 1 root with changes";
        let underline = "═".repeat(title.chars().count());
        assert_eq!(
            text,
            format!(
                "{title}\n{underline}\n\
             \n\
             root        add  change  destroy\n\
             ────────────────────────────────\n\
             quickstart    4      10        0\n\
             \n\
             > - ❌ PVE104 `x`: use `content_type = \"import\"` & fix\n\
             \n\
             ▸ + terraform_data.vm[\"backup\"] — created\n\
             \n\
             \x20   + input.name = \"a &quot;b&quot; <c>\"\n\
             \n\
             fingerprint `95b080b11f0a` · Terraform 1.11.4\n"
            )
        );
    }

    #[test]
    fn a_lone_angle_bracket_is_text_not_a_tag() {
        assert_eq!(inline("a < b and c<1"), "a < b and c<1");
        assert_eq!(inline("x &lt;y&gt; <code>z</code>"), "x <y> z");
        assert_eq!(
            inline("&amp;lt; &#x5B;&#93; &bogus; & ü&lt;"),
            "&lt; [] &bogus; & ü<"
        );
    }
}
