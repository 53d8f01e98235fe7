//! The fuzz corpora and crash fixtures, replayed on stable by `cargo test --lib`: every file of
//! `fuzz/corpus/TARGET/` and `tests/fixtures/fuzz/TARGET/` goes through the fuzz target's own
//! check, so what the fuzzers found stays fixed without a nightly; and the fuzz crate, its
//! corpora and CI kept in step with [`TARGETS`].

use super::{self as fuzzing, TARGETS};
use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The files of `dir`, sorted (none when it does not exist).
fn files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = entries
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.is_file() && p.file_name().is_some_and(|n| n != "README.md"))
        .collect();
    out.sort();
    out
}

/// Every input of `target`: its corpus, then its crash fixtures; for `plan_note` the plan
/// fixtures too (scripts/fuzz.sh gives them to the fuzzer where they are).
fn inputs(target: &str) -> Vec<PathBuf> {
    let mut all = files(&Path::new(ROOT).join("fuzz/corpus").join(target));
    if target == "plan_note" {
        for dir in ["tests/fixtures/plans", "tests/fixtures/plans/bpg"] {
            let plans = files(&Path::new(ROOT).join(dir));
            all.extend(
                plans
                    .into_iter()
                    .filter(|p| p.extension().is_some_and(|e| e == "json")),
            );
        }
    }
    all.extend(files(
        &Path::new(ROOT).join("tests/fixtures/fuzz").join(target),
    ));
    all
}

/// Run `check` on every input; a failure names the file (and the fuzz command that replays it).
fn replay(target: &str, check: fn(&[u8])) -> usize {
    let inputs = inputs(target);
    let mut failed = Vec::new();
    for path in &inputs {
        let data = std::fs::read(path).expect("a corpus file reads");
        if let Err(panic) = std::panic::catch_unwind(|| check(&data)) {
            let why = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            failed.push(format!(
                "{} (cargo +nightly fuzz run {target} {}): {}",
                path.display(),
                path.display(),
                why.chars().take(400).collect::<String>()
            ));
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {} inputs of `{target}` fail:\n{}",
        failed.len(),
        inputs.len(),
        failed.join("\n")
    );
    inputs.len()
}

#[test]
fn every_target_has_a_fuzz_target_file_and_a_seeded_corpus() {
    let manifest = std::fs::read_to_string(Path::new(ROOT).join("fuzz/Cargo.toml")).unwrap();
    for (name, _) in TARGETS {
        let file = Path::new(ROOT).join(format!("fuzz/fuzz_targets/{name}.rs"));
        let text = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("{}: {e} (scripts/fuzz.sh add {name})", file.display()));
        assert!(
            text.contains(&format!("planbot::core::fuzzing::{name}(data)")),
            "{} must call planbot::core::fuzzing::{name}",
            file.display()
        );
        assert!(
            manifest.contains(&format!("name = \"{name}\"")),
            "fuzz/Cargo.toml has no [[bin]] {name}"
        );
        assert!(
            !files(&Path::new(ROOT).join("fuzz/corpus").join(name)).is_empty(),
            "fuzz/corpus/{name} is empty (scripts/fuzz.sh seed)"
        );
    }
    let listed = files(&Path::new(ROOT).join("fuzz/fuzz_targets")).len();
    assert_eq!(
        listed,
        TARGETS.len(),
        "a fuzz target not in fuzzing::TARGETS"
    );
}

#[test]
fn the_committed_corpora_stay_small() {
    let mut total = 0u64;
    for dir in ["fuzz/corpus", "tests/fixtures/fuzz"] {
        for (name, _) in TARGETS {
            for f in files(&Path::new(ROOT).join(dir).join(name)) {
                total += f.metadata().unwrap().len();
            }
        }
    }
    assert!(
        total < 600 * 1024,
        "{total} bytes of corpora: minimise them (docs/development.md, Fuzzing)"
    );
}

#[test]
fn webhook_corpus() {
    replay("webhook", fuzzing::webhook);
}

#[test]
fn plan_note_corpus() {
    replay("plan_note", fuzzing::plan_note);
}

#[test]
fn repo_config_corpus() {
    replay("repo_config", fuzzing::repo_config);
}

#[test]
fn service_config_corpus() {
    replay("service_config", fuzzing::service_config);
}

#[test]
fn markdown_corpus() {
    replay("markdown", fuzzing::markdown);
}

/// The integration test `gitlab_reading::the_defuse_corpus_reads_clean_to_gitlabs_rules` reads
/// these inputs again after defusing, with the port of GitLab's own rules.
#[test]
fn defuse_corpus() {
    assert!(replay("defuse", fuzzing::defuse) > 0);
}

/// The crash fixtures are inputs that once failed: each is kept with a line in the README.
#[test]
fn every_crash_fixture_is_described() {
    let dir = Path::new(ROOT).join("tests/fixtures/fuzz");
    let readme = std::fs::read_to_string(dir.join("README.md")).unwrap_or_default();
    for (name, _) in TARGETS {
        for f in files(&dir.join(name)) {
            let rel = format!("{name}/{}", f.file_name().unwrap().to_string_lossy());
            assert!(
                readme.contains(&rel),
                "tests/fixtures/fuzz/README.md does not say what {rel} was"
            );
        }
    }
}

/// CI runs every target briefly on nightly (the corpora are replayed by the test job, above).
#[test]
fn ci_runs_every_fuzz_target_on_nightly() {
    let text = std::fs::read_to_string(Path::new(ROOT).join(".gitlab-ci.yml")).unwrap();
    let ci: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    let script: Vec<&str> = ci["fuzz"]["script"]
        .as_sequence()
        .expect(".gitlab-ci.yml has a job `fuzz` with a script")
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    assert!(
        script
            .iter()
            .any(|l| l.contains("toolchain install nightly")),
        "{script:?}"
    );
    assert!(
        script.iter().any(|l| l.starts_with("scripts/fuzz.sh all ")),
        "{script:?}"
    );
    let listed = std::process::Command::new("bash")
        .arg(Path::new(ROOT).join("scripts/fuzz.sh"))
        .arg("list")
        .output()
        .expect("scripts/fuzz.sh runs");
    let listed = String::from_utf8(listed.stdout).unwrap();
    let mut listed: Vec<&str> = listed.lines().collect();
    let mut names: Vec<&str> = TARGETS.iter().map(|(n, _)| *n).collect();
    listed.sort_unstable();
    names.sort_unstable();
    assert_eq!(
        listed, names,
        "scripts/fuzz.sh list (what `all` runs) is not fuzzing::TARGETS"
    );
}
