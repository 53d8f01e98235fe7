//! Every file of `templates/` renders with a sample context (`tests/fixtures/template_samples.json`):
//! the test walks the directory, so a new template without a sample fails here.

use planbot::core::templates::{self, Layout};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn files(dir: &Path, root: &Path, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files(&path, root, out);
        } else {
            let rel = path.strip_prefix(root).unwrap().to_string_lossy();
            out.push(rel.replace('\\', "/"));
        }
    }
}

#[test]
fn every_template_renders_with_a_sample() {
    templates::check().expect("templates/ parse and evaluate");
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("templates");
    let mut names = Vec::new();
    files(&root, &root, &mut names);
    names.sort();
    let samples: serde_json::Map<String, Value> = serde_json::from_str(
        &std::fs::read_to_string(
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/template_samples.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let mut out = String::new();
    for name in &names {
        let (_, layout, text) = templates::FILES
            .iter()
            .find(|(n, _, _)| n == name)
            .unwrap_or_else(|| panic!("templates::FILES does not list templates/{name}"));
        if *layout == Layout::Raw {
            let on_disk = std::fs::read_to_string(root.join(name)).unwrap();
            assert_eq!(*text, on_disk, "templates/{name} is embedded as it is");
            continue;
        }
        let cases = samples
            .get(name)
            .and_then(Value::as_array)
            .filter(|c| !c.is_empty())
            .unwrap_or_else(|| {
                panic!("templates/{name} has no sample in tests/fixtures/template_samples.json")
            });
        for (i, case) in cases.iter().enumerate() {
            let rendered = match (case.get("macro").and_then(Value::as_str), case.get("arg")) {
                (Some(m), Some(arg)) => {
                    let static_name: &'static str = templates::FILES
                        .iter()
                        .find(|(n, _, _)| n == name)
                        .map(|(n, _, _)| *n)
                        .unwrap();
                    templates::call_macro(static_name, m, &minijinja::Value::from_serialize(arg))
                }
                _ => templates::render(name, minijinja::Value::from_serialize(case)),
            }
            .unwrap_or_else(|e| panic!("templates/{name} sample {i}: {e:#}"));
            assert!(
                !rendered.trim().is_empty() || name == "note_phrases.j2",
                "templates/{name} sample {i} renders nothing"
            );
            out.push_str(&format!("=== {name} [{i}]\n{rendered}\n"));
        }
    }
    insta::assert_snapshot!(out);
}

/// What an outsider controls in a rendered text: a link, an image, raw HTML, bare URLs, a group
/// and a user mention, a pipe that would split a table row, backticks, a line break.
const HOSTILE: &str = "x|y <a href=\"https://phish.example/a\">Approved by @security</a> [ok](https://phish.example/b) ![i](https://phish.example/c.png) https://phish.example/d www.phish.example @infra/everyone @crowd `t` <b>bold</b>\nnext";

/// The fields of the samples that are not outside text: template switches (`kind`, `verdict`…),
/// planbot's own rendered text passed on as it is (`new_plan`, `banners`, fences), commit ids,
/// numbers and times planbot formats, GitLab user names (GitLab allows letters, digits, `_`, `-`
/// and `.` only: `user` is mentioned on purpose), and the operator's settings (`job_name`,
/// `run_url`, `public_url`, the run page's address `run`; `job_url`, the apply job's address
/// planbot builds from GitLab's MR `web_url` and the job's id).
const NOT_OUTSIDE_TEXT: &[&str] = &[
    "job_url",
    "kind",
    "verdict",
    "state",
    "status",
    "outcome",
    "severity",
    "colour",
    "fence",
    "stateful",
    "origin",
    "new_plan",
    "banners",
    "sha",
    "sha8",
    "short_sha",
    "fresh_short",
    "reviewed",
    "prefix",
    "fingerprint",
    "first_seen",
    "last_seen",
    "username",
    "user",
    "engine",
    "engine_name",
    "job_name",
    "run_url",
    "public_url",
    "runs_url",
    "diff",
    "run_hint",
    "macro",
    "file",
    "checkout",
    "fork_mrs",
    "symbol",
    "reason",
    "command",
    "summary",
    "approver",
    "approved_by",
    "duration",
    "took",
    "on",
    "run",
];

fn hostile(value: &Value, key: &str) -> Value {
    match value {
        Value::String(s) if !s.is_empty() && !NOT_OUTSIDE_TEXT.contains(&key) => {
            Value::String(HOSTILE.into())
        }
        Value::Array(a) => Value::Array(a.iter().map(|v| hostile(v, key)).collect()),
        Value::Object(o) => {
            Value::Object(o.iter().map(|(k, v)| (k.clone(), hostile(v, k))).collect())
        }
        v => v.clone(),
    }
}

/// What GitLab would make of `markdown` that no outsider may cause: a link or image to the
/// attacker's host, an HTML tag of theirs, a mention outside code.
fn live_parts(markdown: &str) -> Vec<String> {
    let markdown = planbot::core::defuse::defuse(markdown);
    let mut options = planbot::core::markdown::gitlab_flavour();
    options.render.r#unsafe = true;
    let html = comrak::markdown_to_html(&markdown, &options);
    let mut found = Vec::new();
    for attr in [
        "href=\"https://phish",
        "src=\"https://phish",
        "href=\"http://www.phish",
    ] {
        if html.contains(attr) {
            found.push(format!("a link or image: {attr}"));
        }
    }
    if html.contains("<b>bold") {
        found.push("an HTML tag".into());
    }
    // GitLab finds no references inside code, pre and links: outside them, a mention is an
    // `@` directly followed by a name.
    let mut outside = String::new();
    let mut rest = html.as_str();
    while let Some(start) = rest.find(['<']) {
        outside.push_str(&rest[..start]);
        let tail = &rest[start..];
        let skip = ["<code", "<pre"].iter().find_map(|open| {
            tail.starts_with(open).then(|| {
                let close = if *open == "<code" {
                    "</code>"
                } else {
                    "</pre>"
                };
                tail.find(close)
                    .map(|e| e + close.len())
                    .unwrap_or(tail.len())
            })
        });
        let n = skip.unwrap_or_else(|| tail.find('>').map(|e| e + 1).unwrap_or(tail.len()));
        rest = &tail[n..];
    }
    outside.push_str(rest);
    for name in ["@crowd", "@infra", "@security"] {
        if outside.contains(name) {
            found.push(format!("a mention {name} outside code"));
        }
    }
    found
}

/// Every note, issue and reply planbot posts, rendered with outside text in every field that
/// can carry it: GitLab would show it all as text — no link, image, HTML or mention of theirs.
#[test]
fn outside_text_in_any_field_of_any_note_stays_text() {
    let samples: serde_json::Map<String, Value> = serde_json::from_str(
        &std::fs::read_to_string(
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/template_samples.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let mut failures = Vec::new();
    let mut rendered_count = 0;
    for (name, cases) in &samples {
        if !name.ends_with(".md.j2") {
            continue;
        }
        for (i, case) in cases.as_array().unwrap().iter().enumerate() {
            // An issue's title is a plain text field, of validated names (project path, root).
            if case.get("kind").and_then(Value::as_str) == Some("title") {
                continue;
            }
            let case = hostile(case, "");
            let Ok(text) = templates::render(name, minijinja::Value::from_serialize(&case)) else {
                continue;
            };
            rendered_count += 1;
            for part in live_parts(&text) {
                failures.push(format!("templates/{name} sample {i}: {part}\n{text}\n"));
            }
        }
    }
    assert!(rendered_count >= 13, "{rendered_count} texts rendered");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
