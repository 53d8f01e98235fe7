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
