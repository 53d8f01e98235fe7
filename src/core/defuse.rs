//! What GitLab would act on in a text planbot posts (a note, an issue, a status), made inert.
//!
//! GitLab runs the quick actions of every note and issue it receives through the API, with the
//! poster's rights: a line that starts with `/` (`/approve`, `/label ~x`, `/assign_reviewer @u`)
//! is executed and removed from the text. It notifies everyone for `@all` (and a chat bridge for
//! `@here`). And an HTML comment that is opened but never closed hides the rest of the note from
//! the reader. Every value planbot shows is escaped for its place, but a note carries engine
//! output and repository values by the thousand: [`defuse`] is the last step before a text
//! leaves for GitLab, so that no call site can forget it and no escaping gap becomes a command.
//!
//! - A line that starts with `/` gets a zero-width space in front: it reads the same, and no
//!   quick action starts there. This is done inside code blocks too: GitLab finds quick actions
//!   with a regular expression whose idea of a code block (a line starting with three backticks
//!   up to the next line that is exactly three backticks, or an "inline code" stretch between
//!   two lines holding backticks) is not CommonMark's, so text in a longer fence, or after a
//!   backtick, can be outside "code" for it while it is inside for the reader.
//! - `@all` and `@here` (any case, not the start of a longer name) get a zero-width space after
//!   the `@`.
//! - An `<!--` whose `-->` is not on the same line gets a zero-width space inside: planbot's own
//!   markers are one-line comments; nothing else may open one.
//!
//! Carriage returns end lines for a Markdown reader but are deleted by GitLab before it looks
//! for quick actions, so they become line feeds first. The function is idempotent.

use std::borrow::Cow;

/// Invisible, and breaks every pattern above.
const ZWSP: char = '\u{200B}';

/// The mentions that notify more than one person.
const MASS_MENTIONS: &[&str] = &["all", "here"];

/// `text` with every line GitLab would run as a quick action, every mass mention and every
/// comment opener that is not closed on its line made inert (see the module docs).
pub fn defuse(text: &str) -> Cow<'_, str> {
    if !needs_work(text) {
        return Cow::Borrowed(text);
    }
    let text = text.replace("\r\n", "\n").replace('\r', "\n");
    let mut out = String::with_capacity(text.len() + 16);
    for (i, line) in text.split('\n').enumerate() {
        if i > 0 {
            out.push('\n');
        }
        defuse_line(line, &mut out);
    }
    Cow::Owned(out)
}

/// A cheap first look: most texts hold none of the patterns.
fn needs_work(text: &str) -> bool {
    text.starts_with('/')
        || text.contains("\n/")
        || text.contains('\r')
        || text.contains("<!--")
        || text.contains('@') && has_mass_mention(text)
}

fn has_mass_mention(text: &str) -> bool {
    let b = text.as_bytes();
    b.iter()
        .enumerate()
        .any(|(i, c)| *c == b'@' && mass_mention_at(b, i + 1).is_some())
}

/// The length of a mass mention's name starting at `at` (just after an `@`), if there is one.
fn mass_mention_at(b: &[u8], at: usize) -> Option<usize> {
    MASS_MENTIONS.iter().find_map(|name| {
        let end = at + name.len();
        let matches = b
            .get(at..end)
            .is_some_and(|s| s.eq_ignore_ascii_case(name.as_bytes()));
        (matches && !continues_name(&b[end..])).then_some(name.len())
    })
}

/// Whether a user name goes on after a mention's first letters (`@allison`, `@all.ops`):
/// GitLab's names are letters, digits, `_`, `-` and `.`, not ending with a `.`.
fn continues_name(rest: &[u8]) -> bool {
    let name_char = |c: &u8| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-');
    match rest {
        [c, ..] if name_char(c) => true,
        [b'.', c, ..] => name_char(c),
        _ => false,
    }
}

fn defuse_line(line: &str, out: &mut String) {
    if line.starts_with('/') {
        out.push(ZWSP);
    }
    let b = line.as_bytes();
    let mut start = 0;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'@' => {
                if let Some(n) = mass_mention_at(b, i + 1) {
                    out.push_str(&line[start..=i]);
                    out.push(ZWSP);
                    start = i + 1;
                    i += 1 + n;
                    continue;
                }
            }
            // A comment that closes on its line stays one (mentions inside it are still broken).
            b'<' if b[i..].starts_with(b"<!--") && !line[i + 4..].contains("-->") => {
                out.push_str(&line[start..i + 2]);
                out.push(ZWSP);
                start = i + 2;
                i += 4;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    out.push_str(&line[start..]);
}

/// The CI job log (the apply's, streamed to the job) is read twice: by the job's script, which
/// passes only when the last line is planbot's verdict (`planbot: apply succeeded`), and by
/// GitLab's log viewer, which acts on a carriage return (only what follows it is shown), on
/// terminal escapes (erase a line, move the cursor, set a title) and on `section_start:`
/// markers. Outside text there — the engine's output, which prints values from the code and
/// from remote APIs — must never read as one of planbot's lines. [`ci_log_outside`] makes each
/// line of it one line with its control characters shown as escapes (`\r`, `\u{1b}`), and puts
/// [`CI_LOG_GUTTER`] in front of a line that would start with `planbot` (ignoring case,
/// whitespace and invisible characters); [`ci_log_own`] makes one of planbot's lines, whose
/// values come from outside too, one line with its control characters shown.
pub const CI_LOG_GUTTER: &str = "> ";

/// One line of outside text for the CI job log (see [`CI_LOG_GUTTER`]); `line` holds no
/// line feed (the caller splits), any that is left is shown as `\n`.
pub fn ci_log_outside(line: &str) -> String {
    let shown = ci_log_visible(line);
    let start = shown
        .trim_start_matches(|c: char| c.is_whitespace() || is_invisible(c))
        .get(..7);
    if start.is_some_and(|s| s.eq_ignore_ascii_case("planbot")) {
        format!("{CI_LOG_GUTTER}{shown}")
    } else {
        shown
    }
}

/// One of planbot's own lines for the CI job log: the text is one line (a line feed a value
/// brought is shown as `\n`, the end trimmed), every control character shown as an escape.
pub fn ci_log_own(text: &str) -> String {
    ci_log_visible(text.trim_end_matches(['\n', '\r']))
}

/// Every control character but the tab as its escape (`\r`, `\n`, `\u{1b}`, `\u{85}`).
fn ci_log_visible(text: &str) -> String {
    if !text.chars().any(|c| c.is_control() && c != '\t') {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() && c != '\t' {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// Characters that take no room on screen: a line starting with them reads as if they were not
/// there.
fn is_invisible(c: char) -> bool {
    matches!(c, '\u{00AD}' | '\u{034F}' | '\u{061C}' | '\u{115F}' | '\u{1160}' | '\u{17B4}'
        | '\u{17B5}' | '\u{180B}'..='\u{180F}' | '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}'
        | '\u{2060}'..='\u{206F}' | '\u{3164}' | '\u{FE00}'..='\u{FE0F}' | '\u{FEFF}' | '\u{FFA0}')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shown(text: &str) -> String {
        text.replace(ZWSP, "")
    }

    #[test]
    fn quick_action_lines_get_a_zero_width_space_and_read_the_same() {
        let text = "plan\n/approve\n/label ~planbot::approved\n  /indented stays\na /b";
        let out = defuse(text);
        assert_eq!(
            out,
            "plan\n\u{200B}/approve\n\u{200B}/label ~planbot::approved\n  /indented stays\na /b"
        );
        assert_eq!(shown(&out), text);
        assert_eq!(defuse("/approve"), "\u{200B}/approve");
        // Inside a code block too: GitLab's extractor does not see fences as a reader does.
        assert_eq!(
            defuse("````\n```\n/approve\n````"),
            "````\n```\n\u{200B}/approve\n````"
        );
    }

    #[test]
    fn carriage_returns_become_line_ends_first() {
        // GitLab deletes `\r` before looking for quick actions: `\n\r/x` is a `/x` line.
        assert_eq!(defuse("a\n\r/approve"), "a\n\n\u{200B}/approve");
        assert_eq!(defuse("a\r\n/approve\r\nb"), "a\n\u{200B}/approve\nb");
        assert_eq!(defuse("a\r/approve"), "a\n\u{200B}/approve");
    }

    #[test]
    fn mass_mentions_are_broken_and_longer_names_are_not() {
        assert_eq!(
            defuse("hi @all and @HERE."),
            "hi @\u{200B}all and @\u{200B}HERE."
        );
        for kept in [
            "@allison",
            "@all_ops",
            "@here-team",
            "@all.ops",
            "@alice",
            "mail@example",
        ] {
            assert_eq!(defuse(kept), kept, "{kept}");
        }
        assert_eq!(defuse("@all"), "@\u{200B}all");
        assert_eq!(defuse("(@all)"), "(@\u{200B}all)");
    }

    #[test]
    fn only_comments_closed_on_their_line_stay_comments() {
        let marker = "<!-- planbot:mr-note v1 -->\n### plan";
        assert_eq!(defuse(marker), marker);
        let hidden = "<!--\n- `terraform_data.db` will be destroyed\n-->";
        let out = defuse(hidden);
        assert!(!out.contains("<!--"), "{out}");
        assert_eq!(shown(&out), hidden);
        let unclosed = "row <!-- x --> then <!-- and never";
        assert_eq!(
            defuse(unclosed),
            "row <!-- x --> then <!\u{200B}-- and never"
        );
        // `<!-->` is a whole comment for CommonMark but not for older parsers: broken.
        assert_eq!(defuse("<!-->"), "<!\u{200B}-->");
    }

    #[test]
    fn it_is_idempotent_and_leaves_plain_text_borrowed() {
        for t in [
            "/approve\n@all <!-- x\n\r/close",
            "plain text, `code`, <!-- ok -->",
            "",
        ] {
            let once = defuse(t).into_owned();
            assert_eq!(defuse(&once), once, "{t:?}");
        }
        assert!(matches!(defuse("a note\nwith lines"), Cow::Borrowed(_)));
    }

    #[test]
    fn outside_text_in_the_ci_log_never_reads_as_planbots_line() {
        for forged in [
            "planbot: apply succeeded",
            "  planbot: apply succeeded",
            "\u{200B}planbot: apply succeeded",
            "\u{FEFF}\u{202E}PLANBOT: apply succeeded",
            "Planbot: still working (20 s)",
        ] {
            let line = ci_log_outside(forged);
            assert!(line.starts_with(CI_LOG_GUTTER), "{line:?}");
        }
        assert_eq!(
            ci_log_outside("x\rplanbot: apply succeeded\u{1b}[2K"),
            "x\\rplanbot: apply succeeded\\u{1b}[2K"
        );
        assert_eq!(ci_log_outside("Apply complete!\tok"), "Apply complete!\tok");
        assert_eq!(ci_log_outside("planbotx"), "> planbotx");
        assert_eq!(ci_log_outside("the planbot"), "the planbot");
        assert_eq!(
            ci_log_own("planbot: apply failed: a\nplanbot: apply succeeded\n"),
            "planbot: apply failed: a\\nplanbot: apply succeeded"
        );
        assert_eq!(
            ci_log_own("planbot: apply succeeded"),
            "planbot: apply succeeded"
        );
    }
}
