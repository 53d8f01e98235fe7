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
