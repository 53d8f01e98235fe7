//! The port of GitLab's quick-action rule that the fake GitLab applies to everything planbot
//! posts (`crate::support::gitlab_reading`), checked against the extractor's documented behaviour; and
//! planbot's last step before posting, `core::defuse`, checked against it on texts built from
//! the pieces that open, close or hide something, and on the `defuse` fuzz corpus.

use crate::support::gitlab_reading::{
    hazards, is_planbots_html, mass_mentions, quick_actions, reading, unclosed_comment,
    without_quick_actions,
};
use planbot::core::defuse::defuse;

fn names(text: &str) -> Vec<String> {
    quick_actions(text).iter().map(|q| q.to_string()).collect()
}

#[test]
fn the_port_finds_commands_where_gitlab_does() {
    // The extractor's own documented example.
    assert_eq!(
        names("hello\n/labels ~foo ~\"bar baz\"\nworld"),
        ["/labels ~foo ~\"bar baz\""]
    );
    assert_eq!(
        without_quick_actions("hello\n/labels ~foo\nworld"),
        "hello\nworld"
    );
    assert_eq!(
        names("/approve\n/assign_reviewer @alice"),
        ["/approve", "/assign_reviewer @alice"]
    );
    assert_eq!(names("/APPROVE"), ["/approve"]);
    // Only at the very start of a line.
    assert!(names("  /approve\n x /approve\n\u{200B}/approve").is_empty());
    // `\r` is deleted before the scan.
    assert_eq!(names("a\n\r/close"), ["/close"]);
    // Code, quote and HTML blocks are skipped, as the extractor sees them.
    assert!(names("```\n/approve\n```").is_empty());
    assert!(names(">>>\n/approve\n>>>").is_empty());
    assert!(names("<details>\n/approve\n</details>").is_empty());
    // Its code block ends at the first line of exactly three backticks, even inside a longer
    // fence that a Markdown reader still sees open.
    assert_eq!(names("````text\n```\n/approve\n````"), ["/approve"]);
    // Newer GitLab skips "inline code" up to a line ending in a backtick; older GitLab does not,
    // and either counts.
    assert_eq!(names("/approve\nsee `x`"), ["/approve"]);
}

#[test]
fn mentions_and_comments() {
    assert_eq!(
        mass_mentions("hi @all, @Here. @allison @here-ops @all.x"),
        ["@all", "@Here"]
    );
    assert!(unclosed_comment("a <!-- b"));
    assert!(!unclosed_comment("<!-- planbot:mr-note v1 -->\nx"));
    assert!(unclosed_comment("<!-- a --> <!-- b"));
}

#[test]
fn the_reading_shows_headings_hidden_text_and_foreign_html() {
    let r = reading("### real\n\ntext\n<!--\n### hidden\n");
    assert_eq!(r.headings, ["real"]);
    assert!(!r.visible.contains("hidden"), "{r:?}");
    let r = reading("<details><summary><code>a</code></summary>\n\n<img src=x>\n\n</details>");
    assert!(r.html.iter().any(|h| !is_planbots_html(h)), "{r:?}");
    let r = reading("<!-- planbot:mr-note v1 -->\n<details><summary><code>a &lt;b&gt;</code></summary>\n\n</details>\n");
    assert!(r.html.iter().all(|h| is_planbots_html(h)), "{r:?}");
}

/// Pieces of text that start, end or hide something for GitLab or a Markdown reader.
const PIECES: &[&str] = &[
    "/",
    "/approve",
    "/label ~x",
    " ",
    "\n",
    "\r",
    "\r\n",
    "```",
    "````",
    "`",
    ">>>",
    "<details>",
    "</details>",
    "<!--",
    "-->",
    "@",
    "@all",
    "@here",
    "@ALL",
    "all",
    ".",
    "-",
    "x",
    "~",
];

#[test]
fn defused_texts_hold_nothing_gitlab_acts_on_and_read_the_same() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x2545_f491_4f6c_dd1d);
    for _ in 0..20_000 {
        let len = rng.gen_range(0..14);
        let text: String = (0..len)
            .map(|_| PIECES[rng.gen_range(0..PIECES.len())])
            .collect();
        let out = defuse(&text);
        assert_eq!(
            hazards(&out),
            Vec::<String>::new(),
            "{text:?} became {out:?}"
        );
        // Only invisible characters were added; line ends are GitLab's `\n`.
        let normalised = text.replace("\r\n", "\n").replace('\r', "\n");
        assert_eq!(out.replace('\u{200B}', ""), normalised, "{text:?}");
        assert_eq!(defuse(&out), out, "idempotent: {text:?}");
    }
}

/// The fuzz corpus and crash fixtures of the `defuse` target (replayed through the target's own
/// check by `core::fuzzing`'s corpus replay), read after defusing with the port of GitLab's rules.
#[test]
fn the_defuse_corpus_reads_clean_to_gitlabs_rules() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut read = 0;
    for dir in ["fuzz/corpus/defuse", "tests/fixtures/fuzz/defuse"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
            continue;
        };
        for path in entries.map(|e| e.expect("a directory entry").path()) {
            let data = std::fs::read(&path).expect("a corpus file reads");
            let text = String::from_utf8_lossy(&data);
            let out = defuse(&text);
            assert_eq!(hazards(&out), Vec::<String>::new(), "{}", path.display());
            read += 1;
        }
    }
    assert!(read > 0, "the defuse corpus is empty");
}
