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
