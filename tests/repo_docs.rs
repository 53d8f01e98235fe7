//! The repository's own texts: CI runs the README's test command, and no merge left its markers.

use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"))
}

/// Every text file under `dir` that a reader or the compiler sees.
fn text_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            if name != "target" && !name.starts_with('.') {
                text_files(&path, out);
            }
        } else if [
            "md", "rs", "toml", "j2", "jinja", "txt", "sh", "tf", "yml", "yaml", "snap",
        ]
        .iter()
        .any(|ext| name.ends_with(&format!(".{ext}")))
        {
            out.push(path);
        }
    }
}

#[test]
fn ci_runs_exactly_the_test_command_the_readme_gives() {
    let readme = read("README.md");
    let ci = read(".ci/run");
    let command = "cargo test --locked --all-targets";
    assert!(
        readme.lines().any(|l| l.trim() == command),
        "the README no longer shows `{command}` on a line of its own"
    );
    let ci_commands: Vec<&str> = ci
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("cargo test"))
        .collect();
    assert_eq!(
        ci_commands,
        vec![command],
        ".ci/run must run the README's test command"
    );
    // The same tools, installed the same way: the README's install line is what .ci/run runs.
    let install = "scripts/install-test-tools.sh";
    assert!(
        readme
            .lines()
            .any(|l| l.starts_with(&format!("sudo {install}"))),
        "the README does not say to run {install} before the tests"
    );
    assert!(
        ci.lines().any(|l| l.trim() == install),
        ".ci/run does not run {install}"
    );
    // And no PostgreSQL handed to the tests: CI runs them as a fresh clone does, where they
    // start their own.
    for named in ["PLANBOT_TEST_POSTGRES_URL=", "postgres.sh", "pg_ctl"] {
        assert!(
            !ci.contains(named),
            ".ci/run names or starts a PostgreSQL: {named}"
        );
    }
}

#[test]
fn no_file_keeps_merge_conflict_markers() {
    let mut files = Vec::new();
    for dir in [
        "src",
        "templates",
        "tests",
        "benches",
        "examples",
        "scripts",
        "deploy",
    ] {
        let dir = repo().join(dir);
        if dir.is_dir() {
            text_files(&dir, &mut files);
        }
    }
    files.push(repo().join("README.md"));
    files.push(repo().join("Cargo.toml"));
    let mut found = Vec::new();
    for file in &files {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        for (n, line) in text.lines().enumerate() {
            if line.starts_with("<<<<<<< ") || line.starts_with(">>>>>>> ") || line == "=======" {
                found.push(format!("{}:{}: {line}", file.display(), n + 1));
            }
        }
    }
    assert!(
        found.is_empty(),
        "merge conflict markers:\n{}",
        found.join("\n")
    );
}

/// Every Markdown file a reader opens: the README and what sits under `docs/` and `deploy/`.
fn markdown_files() -> Vec<PathBuf> {
    let mut files = vec![repo().join("README.md")];
    for dir in ["docs", "deploy"] {
        let dir = repo().join(dir);
        if dir.is_dir() {
            let mut all = Vec::new();
            text_files(&dir, &mut all);
            files.extend(
                all.into_iter()
                    .filter(|p| p.extension().is_some_and(|e| e == "md")),
            );
        }
    }
    files
}

/// Headings (level, text) and the start lines of fenced blocks left open, as comrak reads `text`.
/// A block that swallows a fence line (```` ```sh ````) also counts as open: a missing fence
/// further up pairs every later fence with the wrong partner.
fn markdown_outline(text: &str) -> (Vec<(u8, String)>, Vec<usize>) {
    use comrak::nodes::NodeValue;
    let arena = comrak::Arena::new();
    let root = comrak::parse_document(&arena, text, &comrak::Options::default());
    let mut headings = Vec::new();
    let mut open_fences = Vec::new();
    for node in root.descendants() {
        let data = node.data();
        match &data.value {
            NodeValue::Heading(h) => headings.push((h.level, node.collect_text())),
            NodeValue::CodeBlock(c)
                if c.fenced
                    && (!c.closed
                        || c.literal.lines().any(|l| l.trim_start().starts_with("```"))) =>
            {
                open_fences.push(data.sourcepos.start.line)
            }
            _ => {}
        }
    }
    (headings, open_fences)
}

#[test]
fn every_fenced_block_is_closed_so_the_sections_after_it_render() {
    for file in markdown_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        let (_, open) = markdown_outline(&text);
        assert!(
            open.is_empty(),
            "{}: the fenced block opened on line(s) {open:?} is never closed: everything after it renders as code",
            file.display()
        );
    }
    // The README's sections a reader navigates by are headings, not text inside a code block.
    let (headings, _) = markdown_outline(&read("README.md"));
    for want in [
        "Quick start",
        "Connect a GitLab project",
        "Run the service",
        "Apply from main",
        "planbot doctor",
        "Endpoints",
        "Install",
        "Operate",
    ] {
        assert!(
            headings.iter().any(|(level, t)| *level == 2 && t == want),
            "README.md: `## {want}` is not a heading as comrak reads it; headings: {headings:?}"
        );
    }
}

#[test]
fn no_test_or_source_reads_outside_the_repository() {
    // A clone with nothing beside it must pass: fixtures live in tests/fixtures/.
    let mut files = Vec::new();
    for dir in ["src", "tests", "benches", "scripts", ".ci"] {
        text_files(&repo().join(dir), &mut files);
    }
    files.push(repo().join(".ci/run"));
    let needle = ["..", "/shared"].concat();
    let env_needle = ["PLANBOT_", "SHARED_DIR"].concat();
    let offenders: Vec<String> = files
        .iter()
        .filter(|f| !f.starts_with(repo().join("tests/fixtures")))
        .filter(|f| {
            let text = std::fs::read_to_string(f).unwrap_or_default();
            text.contains(&needle) || text.contains(&env_needle)
        })
        .map(|f| f.strip_prefix(repo()).unwrap().display().to_string())
        .collect();
    assert!(
        offenders.is_empty(),
        "these files read outside the repository: {offenders:?}"
    );
}

#[test]
fn ci_refuses_to_run_without_an_engine() {
    // With no engine on PATH and CI set, .ci/run must fail before the tests and say why.
    let dir = tempfile::tempdir().unwrap();
    // A PATH with the shell tools .ci/run uses and no engine.
    for tool in ["dirname", "head"] {
        let real = ["/usr/bin", "/bin"]
            .iter()
            .map(|d| Path::new(d).join(tool))
            .find(|p| p.exists())
            .unwrap_or_else(|| panic!("{tool} not in /usr/bin or /bin"));
        std::os::unix::fs::symlink(real, dir.path().join(tool)).unwrap();
    }
    let out = std::process::Command::new("/bin/bash")
        .arg(repo().join(".ci/run"))
        .env_clear()
        .env("PATH", dir.path())
        .env("CI", "true")
        .env("HOME", dir.path())
        .output()
        .expect("bash runs .ci/run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert!(
        stderr.contains("no tofu or terraform on PATH"),
        "stderr: {stderr}"
    );
}

#[test]
fn every_repository_file_the_readme_names_exists() {
    let readme = read("README.md");
    let prefixes = [
        "deploy/",
        "tests/",
        "src/",
        "templates/",
        "examples/",
        "scripts/",
        "benches/",
        ".ci/",
    ];
    let top = ["Dockerfile", ".gitlab-ci.yml", ".dockerignore", "LICENSE"];
    let mut named = std::collections::BTreeSet::new();
    for word in readme.split(|c: char| c.is_whitespace() || "`()\"',;[]".contains(c)) {
        let word = word.trim_end_matches(['.', ':']);
        // `src/NAME/after/` and the like are patterns, not files.
        if word.contains("NAME") || word.contains('*') || word.contains('<') {
            continue;
        }
        if prefixes.iter().any(|p| word.starts_with(p)) || top.contains(&word) {
            named.insert(word.to_string());
        }
    }
    for want in [
        "Dockerfile",
        "deploy/systemd/planbot.service",
        "deploy/kubernetes",
        ".gitlab-ci.yml",
    ] {
        assert!(
            named.iter().any(|n| n.trim_end_matches('/') == want),
            "the README no longer shows how to use {want}"
        );
    }
    let missing: Vec<&String> = named.iter().filter(|n| !repo().join(n).exists()).collect();
    assert!(
        missing.is_empty(),
        "the README names files that do not exist: {missing:?}"
    );
}

/// The comment above `key` in the example config (its description), if any.
fn example_description(example: &str, key: &str) -> Option<String> {
    let (section, name) = key.rsplit_once('.').unwrap_or(("", key));
    let lines: Vec<&str> = example.lines().collect();
    let header = |l: &str| {
        let l = l.trim().trim_start_matches('#').trim();
        l.strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .map(str::to_string)
    };
    let assigns = |l: &str, n: &str| {
        l.strip_prefix(n)
            .is_some_and(|r| r.trim_start().starts_with('='))
    };
    let mut current = String::new();
    for (i, line) in lines.iter().enumerate() {
        if let Some(h) = header(line) {
            current = h;
            continue;
        }
        let bare = line.trim().trim_start_matches('#').trim();
        if current != section || !(assigns(bare, name) || assigns(bare, &format!("{name}_file"))) {
            continue;
        }
        let mut desc = Vec::new();
        for above in lines[..i].iter().rev() {
            if header(above).as_deref() == Some(section) && desc.is_empty() {
                continue; // a key right under its header: the header's comment describes it
            }
            let Some(text) = above.trim().strip_prefix('#') else {
                break;
            };
            let text = text.trim();
            // A commented-out key (`# signing_token = ...`) ends the description above it.
            let word: String = text
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect();
            if !word.is_empty() && assigns(text, &word) || header(text).is_some() {
                break;
            }
            desc.push(text);
        }
        desc.reverse();
        let desc = desc.join(" ");
        return (!desc.is_empty()).then_some(desc);
    }
    None
}

const REFERENCE_START: &str = "<!-- settings reference: generated, see tests/repo_docs.rs -->";
const REFERENCE_END: &str = "<!-- end of settings reference -->";

/// The settings table: one row per key of the parser's table, described by the example config.
fn settings_reference() -> String {
    let example = read("deploy/planbot.example.toml");
    let mut out = String::from(
        "| Setting | Environment variable | Type | What it does |\n|---|---|---|---|\n",
    );
    for s in planbot::core::config::settings() {
        let description = example_description(&example, s.key)
            .or_else(|| {
                // [proxmox.plan] / [proxmox.apply] repeat [proxmox]'s keys.
                let (scope, name) = s.key.strip_prefix("proxmox.")?.split_once('.')?;
                Some(format!(
                    "`proxmox.{name}` for {} only.",
                    if scope == "plan" { "plans" } else { "applies" }
                ))
            })
            .unwrap_or_else(|| panic!("deploy/planbot.example.toml does not describe {}", s.key));
        let (setting, env) = if s.secret && s.kind != "table" {
            (
                format!("`{}` (or `{}_file`)", s.key, s.key),
                format!("`{}` (or `{}_FILE`)", s.env, s.env),
            )
        } else if s.secret {
            (
                format!("`{}` (or `{}_file`)", s.key, s.key),
                format!("`{}`", s.env),
            )
        } else {
            (format!("`{}`", s.key), format!("`{}`", s.env))
        };
        let secret = if s.secret { ", secret" } else { "" };
        out.push_str(&format!(
            "| {setting} | {env} | {}{secret} | {} |\n",
            s.kind,
            description.replace('|', "\\|")
        ));
    }
    out
}

#[test]
fn the_readmes_settings_reference_is_the_parsers_table() {
    let readme = read("README.md");
    let expected = settings_reference();
    let found = readme
        .split_once(REFERENCE_START)
        .and_then(|(_, rest)| rest.split_once(REFERENCE_END))
        .map(|(table, _)| table.trim_start_matches('\n'));
    if found != Some(expected.as_str()) {
        if std::env::var_os("PLANBOT_UPDATE_README").is_some() {
            let (head, rest) = readme
                .split_once(REFERENCE_START)
                .expect("the start marker");
            let (_, tail) = rest.split_once(REFERENCE_END).expect("the end marker");
            std::fs::write(
                repo().join("README.md"),
                format!("{head}{REFERENCE_START}\n{expected}{REFERENCE_END}{tail}"),
            )
            .unwrap();
        }
        panic!(
            "README.md's settings reference is not the parser's table (run this test with \
             PLANBOT_UPDATE_README=1 to rewrite it); expected, between `{REFERENCE_START}` and \
             `{REFERENCE_END}`:\n{expected}"
        );
    }
}

#[test]
fn the_readme_reads_in_an_operators_order_and_internals_live_in_docs() {
    // What it is → install → connect → the first MR → apply → operate → reference.
    let (headings, _) = markdown_outline(&read("README.md"));
    let top: Vec<&str> = headings
        .iter()
        .filter(|(level, _)| *level == 2)
        .map(|(_, t)| t.as_str())
        .collect();
    let want = [
        "Quick start",
        "Install",
        "Connect a GitLab project",
        "Run the service",
        "The plan note",
        "Apply from main",
        "Operate",
        "Settings reference",
    ];
    let positions: Vec<usize> = want
        .iter()
        .map(|w| {
            top.iter()
                .position(|t| t == w)
                .unwrap_or_else(|| panic!("README.md has no `## {w}`: {top:?}"))
        })
        .collect();
    assert!(
        positions.windows(2).all(|p| p[0] < p[1]),
        "README.md's sections are out of order: {top:?}"
    );
    assert_eq!(top.last(), Some(&"Settings reference"), "{top:?}");
    // The internals (store, benchmarks, measurements) are in docs/, linked from the README.
    for gone in ["Durability", "Performance"] {
        assert!(
            !top.contains(&gone),
            "`## {gone}` belongs in docs/internals.md"
        );
    }
    let internals = read("docs/internals.md");
    for kept in ["## Durability", "### Load benchmark", "## Performance"] {
        assert!(internals.contains(kept), "docs/internals.md lacks {kept}");
    }
    assert!(read("README.md").contains("](docs/internals.md)"));
}
