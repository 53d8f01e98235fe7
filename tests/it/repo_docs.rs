//! The repository's own texts: the README is a doorway to the pages of `docs/`, every link of
//! theirs resolves, CI runs the documented test command, and no merge left its markers.

use std::path::{Path, PathBuf};

/// The page that tells contributors how to run the tests.
const DEVELOPMENT_PAGE: &str = "docs/development.md";
/// The page that tells operators how to install planbot.
const INSTALL_PAGE: &str = "docs/install.md";

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
fn ci_runs_exactly_the_test_command_the_docs_give() {
    let readme = read(DEVELOPMENT_PAGE);
    let ci = read(".ci/run");
    let command = "cargo test --locked --all-targets";
    assert!(
        readme.lines().any(|l| l.trim() == command),
        "{DEVELOPMENT_PAGE} no longer shows `{command}` on a line of its own"
    );
    let ci_commands: Vec<&str> = ci
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("cargo test"))
        .collect();
    assert_eq!(
        ci_commands,
        vec![command],
        ".ci/run must run the documented test command"
    );
    // The same tools, installed the same way: the documented install line is what .ci/run runs.
    let install = "scripts/install-test-tools.sh";
    assert!(
        readme
            .lines()
            .any(|l| l.starts_with(&format!("sudo {install}"))),
        "{DEVELOPMENT_PAGE} does not say to run {install} before the tests"
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
        "docs",
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
                        // A line that would close it (an inner fence as long as its own):
                        // a longer outer fence may hold a shorter one, as an example does.
                        || c.literal.lines().any(|l| {
                            let t = l.trim_start();
                            t.len() - t.trim_start_matches('`').len() >= c.fence_length.max(3)
                        })) =>
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
    // The sections a reader navigates by are headings, not text inside a code block.
    for (page, wanted) in [
        (
            "README.md",
            &["Five-minute start", "Documentation", "Developing planbot"][..],
        ),
        (
            INSTALL_PAGE,
            &[
                "The binary",
                "systemd",
                "Kubernetes",
                "Connect a GitLab project",
            ],
        ),
        (
            "docs/workflow.md",
            &["The plan note", "Apply from main", "State"],
        ),
        (
            "docs/operations.md",
            &["Run the service", "planbot doctor", "Endpoints", "Logs"],
        ),
        (SETTINGS_PAGE, &["Settings reference"]),
    ] {
        let (headings, _) = markdown_outline(&read(page));
        for want in wanted {
            assert!(
                headings.iter().any(|(level, t)| *level == 2 && t == want),
                "{page}: `## {want}` is not a heading as comrak reads it; headings: {headings:?}"
            );
        }
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
fn every_repository_file_the_docs_name_exists() {
    let prefixes = [
        "deploy/",
        "docs/",
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
    for file in markdown_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        let page = file.strip_prefix(repo()).unwrap().display().to_string();
        for word in text.split(|c: char| c.is_whitespace() || "`()\"',;[]".contains(c)) {
            // A link's file, without the heading it names.
            let word = word.split('#').next().unwrap().trim_end_matches(['.', ':']);
            // `src/NAME/after/` and the like are patterns, not files.
            if word.contains("NAME") || word.contains('*') || word.contains('<') {
                continue;
            }
            if prefixes.iter().any(|p| word.starts_with(p)) || top.contains(&word) {
                named.insert((word.to_string(), page.clone()));
            }
        }
    }
    for want in [
        "Dockerfile",
        "deploy/systemd/planbot.service",
        "deploy/kubernetes",
        ".gitlab-ci.yml",
    ] {
        assert!(
            named.iter().any(|(n, _)| n.trim_end_matches('/') == want),
            "the docs no longer show how to use {want}"
        );
    }
    let missing: Vec<&(String, String)> = named
        .iter()
        .filter(|(n, _)| !repo().join(n).exists())
        .collect();
    assert!(
        missing.is_empty(),
        "the docs name files that do not exist (file, page): {missing:?}"
    );
}

/// The page that holds the settings reference, between the two markers below.
const SETTINGS_PAGE: &str = "docs/configuration.md";
const REFERENCE_START: &str = "<!-- settings reference: generated, see tests/it/repo_docs.rs -->";
const REFERENCE_END: &str = "<!-- end of settings reference -->";

/// The settings table in the docs is the one `core::config::keys` declares: generated from
/// the declarations, so a key added, renamed or described anew fails here until the docs
/// follow (`PLANBOT_UPDATE_README=1` rewrites the table in place).
#[test]
fn the_settings_reference_in_the_docs_is_the_declared_keys() {
    let expected = planbot::core::config::keys::reference_table();
    let holders: Vec<(std::path::PathBuf, String)> = markdown_files()
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            (p, text)
        })
        .filter(|(_, text)| text.contains(REFERENCE_START))
        .collect();
    assert_eq!(
        holders.len(),
        1,
        "exactly one document holds the settings table, between `{REFERENCE_START}` and `{REFERENCE_END}`: {:?}",
        holders.iter().map(|(p, _)| p).collect::<Vec<_>>()
    );
    let (path, text) = &holders[0];
    let found = text
        .split_once(REFERENCE_START)
        .and_then(|(_, rest)| rest.split_once(REFERENCE_END))
        .map(|(table, _)| table.trim_start_matches('\n'));
    if found != Some(expected.as_str()) {
        if std::env::var_os("PLANBOT_UPDATE_README").is_some() {
            let (head, rest) = text.split_once(REFERENCE_START).expect("the start marker");
            let (_, tail) = rest.split_once(REFERENCE_END).expect("the end marker");
            std::fs::write(
                path,
                format!("{head}{REFERENCE_START}\n{expected}{REFERENCE_END}{tail}"),
            )
            .unwrap();
        }
        panic!(
            "{}: the settings reference is not the declared keys (run this test with \
             PLANBOT_UPDATE_README=1 to rewrite it); expected, between `{REFERENCE_START}` and \
             `{REFERENCE_END}`:\n{expected}",
            path.display()
        );
    }
}

/// The `##` headings of `page`, in order.
fn sections(page: &str) -> Vec<String> {
    markdown_outline(&read(page))
        .0
        .into_iter()
        .filter(|(level, _)| *level == 2)
        .map(|(_, t)| t)
        .collect()
}

/// Asserts that `page` has the `##` sections `want`, in that order (others may sit between).
fn assert_in_order(page: &str, want: &[&str]) {
    let top = sections(page);
    let positions: Vec<usize> = want
        .iter()
        .map(|w| {
            top.iter()
                .position(|t| t == w)
                .unwrap_or_else(|| panic!("{page} has no `## {w}`: {top:?}"))
        })
        .collect();
    assert!(
        positions.windows(2).all(|p| p[0] < p[1]),
        "{page}'s sections are out of order: {top:?}"
    );
}

/// `text` without its fenced code blocks (the prose a reader reads as such).
fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

#[test]
fn the_readme_is_a_doorway_and_each_page_reads_in_its_readers_order() {
    // What planbot is, a five-minute start, the pages, then how to work on it; short.
    let readme = read("README.md");
    assert!(
        readme.len() < 15_000,
        "README.md is {} bytes: it is a doorway (what planbot is, a five-minute start, the \
         pages); put the rest in docs/",
        readme.len()
    );
    assert_in_order(
        "README.md",
        &["Five-minute start", "Documentation", "Developing planbot"],
    );
    // The five-minute start installs planbot before anything runs it, and nothing before the
    // install asks for a database; no `cargo run` start followed by a bare `planbot`.
    let start = readme.split_once("## Five-minute start").unwrap().1;
    let (before_install, _) = start.split_once("```sh\n").unwrap();
    let first_block = start.split_once("```sh\n").unwrap().1;
    assert!(
        first_block.starts_with("cargo install "),
        "the first step must install planbot: {first_block}"
    );
    assert!(
        !before_install.contains("PostgreSQL"),
        "the five-minute start speaks of PostgreSQL before the install: {before_install}"
    );
    assert!(!readme.contains("cargo run"), "README.md runs `cargo run`");
    // Every page of docs/ is a link of the README's.
    for entry in std::fs::read_dir(repo().join("docs")).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if name.ends_with(".md") {
            assert!(
                readme.contains(&format!("](docs/{name})")),
                "README.md does not link docs/{name}"
            );
        }
    }

    // Each page in the order its reader follows.
    assert_in_order(
        INSTALL_PAGE,
        &[
            "Requirements",
            "One starting config for every way",
            "The binary",
            "Container image",
            "systemd",
            "Kubernetes",
            "Connect a GitLab project",
        ],
    );
    assert_in_order(
        "docs/workflow.md",
        &[
            "What planbot does with each event",
            "The plan note",
            "Plan on your machine",
            "Apply from main",
            "State",
        ],
    );
    assert_in_order(
        "docs/operations.md",
        &[
            "Run the service",
            "planbot doctor",
            "Logs",
            "Metrics",
            "Endpoints",
            "Backup and restore",
            "Upgrade",
        ],
    );
    assert_eq!(
        sections(SETTINGS_PAGE).last().map(String::as_str),
        Some("Settings reference")
    );
    assert_in_order(
        DEVELOPMENT_PAGE,
        &["Run the tests", "CI", "Internals and measurements"],
    );

    // The internals (store, benchmarks, measurements) have their own page.
    let internals = read("docs/internals.md");
    for kept in ["## Durability", "### Load benchmark", "## Performance"] {
        assert!(internals.contains(kept), "docs/internals.md lacks {kept}");
    }

    // The webhook is set up in one place.
    let described: Vec<String> = support_pages()
        .into_iter()
        .filter(|(_, text)| prose(text).contains("Settings → Webhooks → Add new webhook"))
        .map(|(page, _)| page)
        .collect();
    assert_eq!(
        described,
        [INSTALL_PAGE],
        "the webhook setup is described in {described:?}"
    );
    for (page, text) in support_pages() {
        let prose = prose(&text);
        let hooks = prose.matches("Settings → Webhooks").count();
        assert!(
            page == INSTALL_PAGE || hooks == 0,
            "{page} describes the webhook setup again: link {INSTALL_PAGE}#connect-a-gitlab-project"
        );
    }
}

/// The README and every page under `docs/`, as (path from the top, text).
fn support_pages() -> Vec<(String, String)> {
    markdown_files()
        .into_iter()
        .filter(|f| !f.starts_with(repo().join("deploy")))
        .map(|f| {
            let text = std::fs::read_to_string(&f).unwrap();
            (f.strip_prefix(repo()).unwrap().display().to_string(), text)
        })
        .collect()
}

#[test]
fn every_long_page_opens_with_its_table_of_contents() {
    // A page a reader scrolls (more than a few screens) lists its sections before the first one.
    for (page, text) in support_pages() {
        if page == "README.md" || text.len() < 6_000 {
            continue;
        }
        let before_first = text.split("\n## ").next().unwrap();
        let missing: Vec<String> = sections(&page)
            .iter()
            .map(|s| anchor_gitlab(s))
            .filter(|a| !before_first.contains(&format!("](#{a})")))
            .collect();
        assert!(
            missing.is_empty(),
            "{page}: its table of contents (before the first `##`) does not link {missing:?}"
        );
    }
}

/// A heading's anchor as GitLab makes it: lower case, every character but letters, digits, `_`,
/// `-` and spaces dropped, spaces as `-`, runs of `-` as one.
fn anchor_gitlab(heading: &str) -> String {
    let kept: String = heading
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '_' || *c == '-' || *c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect();
    let mut out = String::new();
    for c in kept.chars() {
        if !(c == '-' && out.ends_with('-')) {
            out.push(c);
        }
    }
    out
}

/// A heading's anchor as GitHub makes it: the same, but runs of `-` are kept.
fn anchor_github(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '_' || *c == '-' || *c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors a link may name in `text`: those of its headings that GitLab and GitHub both
/// make the same way (the second heading of a name gets `-1`, and so on).
fn anchors(text: &str) -> std::collections::BTreeSet<String> {
    let mut seen = std::collections::BTreeMap::<String, usize>::new();
    let mut out = std::collections::BTreeSet::new();
    for (_, heading) in markdown_outline(text).0 {
        let (gitlab, github) = (anchor_gitlab(&heading), anchor_github(&heading));
        let n = seen.entry(gitlab.clone()).or_default();
        let suffix = if *n == 0 {
            String::new()
        } else {
            format!("-{n}")
        };
        *n += 1;
        if gitlab == github {
            out.insert(format!("{gitlab}{suffix}"));
        }
    }
    out
}

/// Every link target written in `text` (`[text](target)`), as comrak reads it.
fn link_targets(text: &str) -> Vec<String> {
    use comrak::nodes::NodeValue;
    let arena = comrak::Arena::new();
    let root = comrak::parse_document(&arena, text, &comrak::Options::default());
    root.descendants()
        .filter_map(|node| match &node.data().value {
            NodeValue::Link(link) | NodeValue::Image(link) => Some(link.url.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn every_relative_link_of_the_docs_reaches_a_file_and_its_heading() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in markdown_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        let page = file.strip_prefix(repo()).unwrap().display().to_string();
        for target in link_targets(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let resolved = if path.is_empty() {
                file.clone()
            } else {
                file.parent().unwrap().join(path)
            };
            // Inside the repository, and there.
            let Ok(resolved) = resolved.canonicalize() else {
                broken.push(format!("{page}: ({target}): no such file"));
                continue;
            };
            if !resolved.starts_with(repo().canonicalize().unwrap()) {
                broken.push(format!("{page}: ({target}): outside the repository"));
                continue;
            }
            if anchor.is_empty() {
                continue;
            }
            let target_text = std::fs::read_to_string(&resolved).unwrap_or_default();
            if resolved.extension().is_none_or(|e| e != "md")
                || !anchors(&target_text).contains(anchor)
            {
                broken.push(format!(
                    "{page}: ({target}): no heading of {} has the anchor `#{anchor}`",
                    resolved
                        .strip_prefix(repo().canonicalize().unwrap())
                        .unwrap()
                        .display()
                ));
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} relative links found: is the parse right?"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn no_text_cites_a_document_the_repository_does_not_hold() {
    // A comment or page that points a reader at a document must point at one they have.
    let mut files = Vec::new();
    for dir in [
        "src",
        "templates",
        "tests",
        "benches",
        "scripts",
        "examples",
        "deploy",
        "docs",
        ".ci",
    ] {
        let dir = repo().join(dir);
        if dir.is_dir() {
            text_files(&dir, &mut files);
        }
    }
    files.push(repo().join("README.md"));
    files.push(repo().join("CHANGELOG.md"));
    let mut held = std::collections::BTreeSet::new();
    let mut all = Vec::new();
    text_files(&repo(), &mut all);
    for f in &all {
        held.insert(f.file_name().unwrap().to_string_lossy().into_owned());
    }
    // A numbered section of a design document that is not in the repository.
    let section_sign = ["design", " §"].concat();
    let mut found = Vec::new();
    // GitLab's payloads name the pages of GitLab's documentation they were copied from.
    let gitlab_copies = repo().join("tests/fixtures/gitlab");
    for file in files.iter().filter(|f| !f.starts_with(&gitlab_copies)) {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        let shown = file.strip_prefix(repo()).unwrap().display().to_string();
        for (n, line) in text.lines().enumerate() {
            if line.contains(&section_sign) {
                found.push(format!("{shown}:{}: {line}", n + 1));
            }
            for word in line.split(|c: char| c.is_whitespace() || "`()\"',;[]<>".contains(c)) {
                let word = word.trim_end_matches(['.', ':']);
                if !word.ends_with(".md")
                    || word.starts_with('.')
                    || word.contains("://")
                    || word.contains('*')
                {
                    continue;
                }
                let name = word.rsplit('/').next().unwrap();
                let there = held.contains(name)
                    || repo().join(word).exists()
                    || file.parent().unwrap().join(word).exists();
                if !there {
                    found.push(format!("{shown}:{}: {word}", n + 1));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "texts cite documents the repository does not hold (say what they mean, or link a page \
         of docs/):\n{}",
        found.join("\n")
    );
}

/// Where a test named in docs/security.md's threat table lives: `module::name` in the
/// integration tests (`tests/it/module.rs`), or a path in the library (`core::…::tests::name`,
/// `capabilities::…::tests::name`, `flows::…::tests::name`) whose file holds `fn name`.
fn test_is_defined(path: &str) -> bool {
    let parts: Vec<&str> = path.split("::").collect();
    let (name, modules) = parts.split_last().expect("a path");
    let defines = |file: PathBuf| {
        std::fs::read_to_string(file).is_ok_and(|text| text.contains(&format!("fn {name}(")))
    };
    if let [module] = modules {
        return defines(repo().join(format!("tests/it/{module}.rs")));
    }
    let modules: Vec<&str> = modules.iter().copied().filter(|m| *m != "tests").collect();
    let base = repo().join("src").join(modules.join("/"));
    [
        base.with_extension("rs"),
        base.join("mod.rs"),
        base.join("tests.rs"),
    ]
    .into_iter()
    .any(defines)
}

#[test]
fn every_test_the_threat_table_names_exists() {
    let page = read("docs/security.md");
    let table = page
        .split_once("## The threat table")
        .and_then(|(_, rest)| rest.split("\n## ").next())
        .expect("docs/security.md has a section `## The threat table`");
    let mut named = 0;
    let mut missing = Vec::new();
    for row in table
        .lines()
        .filter(|l| l.starts_with("| ") && l.ends_with(" |"))
    {
        let test_cell = row.trim_end_matches(" |").rsplit(" | ").next().unwrap();
        for span in test_cell.split('`').skip(1).step_by(2) {
            if !span.contains("::") || span.contains(' ') {
                continue;
            }
            named += 1;
            if !test_is_defined(span) {
                missing.push(span.to_string());
            }
        }
    }
    assert!(named >= 30, "the threat table names only {named} tests");
    assert!(
        missing.is_empty(),
        "docs/security.md's threat table names tests that do not exist: {missing:?}"
    );
}
