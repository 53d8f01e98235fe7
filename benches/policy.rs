//! Policy benchmark: a few policy sets over a generated 5,000-resource plan, next to rendering
//! the same plan.
//!
//! The plan is a whole `show -json` document (11.6 MiB: `resource_changes` with the
//! `planned_values`, `prior_state` and `configuration` a real one carries); the sets read only
//! `resource_changes`, so that is all planbot reads into the interpreter (the bench also prints
//! what reading the whole document would take).
//!
//! `cargo bench --bench policy` prints, for one run in this process, the time of
//! `core::policy::evaluate` with two sets (the Proxmox library of `examples/policies/`, five
//! files, and conftest's Terraform example) and of the whole `planbot render` path on the same
//! document, the sets one after the other (as before they ran side by side) and what the plan
//! run waits for (the document read beside lint and the fingerprint, then the sets), then
//! criterion times both. Under `cargo test --all-targets` (no `--bench`) it runs
//! once on a small plan, to stay fast.

use criterion::{black_box, Criterion};
use planbot::core::fingerprint::Fingerprint;
use planbot::core::plan::Plan;
use planbot::core::policy::{
    evaluate, evaluate_document, reads_of, InputReads, PlanDocument, PlanInput, PolicyFile,
    PolicySet, DEFAULT_LIMIT,
};
use planbot::core::proxmox::lint::lint;
use planbot::core::redact::Secrets;
use planbot::core::render::NoteContext;
use planbot::flows::cli::render::{report, Format};
use std::io::Write;
use std::path::Path;
use std::time::Instant;
use synth_plan::synth_show_json;

#[path = "support/synth_plan.rs"]
mod synth_plan;

fn rego_files(dir: &str) -> Vec<PolicyFile> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut files: Vec<PolicyFile> = std::fs::read_dir(&dir)
        .expect("the policy directory")
        .map(|e| e.expect("an entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "rego"))
        .map(|p| PolicyFile {
            path: p.display().to_string(),
            text: std::fs::read_to_string(&p).expect("a policy file"),
        })
        .collect();
    files.sort_by(|a, b| a.path.cmp(&b.path));
    files
}

fn sets() -> Vec<PolicySet> {
    vec![
        PolicySet {
            name: "proxmox".into(),
            namespace: "main".into(),
            files: rego_files("examples/policies"),
            limit: DEFAULT_LIMIT,
        },
        PolicySet {
            name: "conftest-example".into(),
            namespace: "main".into(),
            files: rego_files("tests/fixtures/policy/conftest_v1"),
            limit: DEFAULT_LIMIT,
        },
    ]
}

fn main() {
    let benching = std::env::args().any(|a| a == "--bench");
    let n = if benching { 5_000 } else { 100 };
    let json = String::from_utf8(synth_show_json(n)).expect("the plan is UTF-8");
    let plan = Plan::from_json(json.as_bytes()).expect("the plan parses");
    let findings = lint(&plan, &[]);
    let sets = sets();
    let input = PlanInput {
        plan_json: &json,
        findings: &findings,
        root: "fleet",
    };

    let timed = |sets: &[PolicySet]| {
        let t = Instant::now();
        let _ = evaluate(&input, sets);
        t.elapsed().as_secs_f64() * 1e3
    };
    let reads = reads_of(&sets);
    let read_ms = |reads: &InputReads| {
        let t = Instant::now();
        let doc = PlanDocument::read_for(&json, reads).expect("the plan reads");
        let ms = t.elapsed().as_secs_f64() * 1e3;
        drop(doc);
        ms
    };
    let (convert, whole) = (read_ms(&reads), read_ms(&InputReads::Whole));
    let (library, example) = (timed(&sets[..1]), timed(&sets[1..]));
    let t = Instant::now();
    let verdict = evaluate(&input, &sets);
    let policies = t.elapsed();
    for s in &verdict.sets {
        assert!(s.error().is_none(), "{}: {:?}", s.name, s.error());
    }
    let failures: usize = verdict
        .sets
        .iter()
        .filter_map(|s| s.results())
        .map(|r| r.failures.len())
        .sum();
    let t = Instant::now();
    let note = report(
        &plan,
        &NoteContext::default(),
        &Secrets::new(),
        b"bench-key",
        Format::Markdown,
    );
    let render = t.elapsed();
    let _ = writeln!(
        std::io::stderr().lock(),
        "policy bench: {n} resources, plan JSON {} KiB; evaluate 2 sets ({} files, {failures} failures): {:.1} ms; the `planbot render` path on the same plan: {:.1} ms (note {} chars); policies / render = {:.2}",
        json.len() / 1024,
        sets.iter().map(|s| s.files.len()).sum::<usize>(),
        policies.as_secs_f64() * 1e3,
        render.as_secs_f64() * 1e3,
        note.len(),
        policies.as_secs_f64() / render.as_secs_f64(),
    );
    let _ = writeln!(
        std::io::stderr().lock(),
        "policy bench: the plan read into the interpreter {convert:.1} ms (the keys the sets read: {reads:?}; the whole document {whole:.1} ms); with the Proxmox library alone {library:.1} ms, with conftest's example alone {example:.1} ms"
    );
    // As before the sets ran side by side: the document read once, the sets one after the other.
    let t = Instant::now();
    let doc = PlanDocument::read_for(&json, &reads).expect("the plan reads");
    for set in &sets {
        let _ = evaluate_document(&doc, &findings, "fleet", std::slice::from_ref(set));
    }
    let one_by_one = t.elapsed().as_secs_f64() * 1e3;
    // As the service runs it: the document read on another core while lint and the fingerprint
    // run, then the sets; what the plan run waits for beyond its own checks is the rest.
    let t = Instant::now();
    let _ = (lint(&plan, &[]), Fingerprint::of(&plan, b"bench-key"));
    let own_checks = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    let (doc, _, _) = std::thread::scope(|s| {
        let doc = s.spawn(|| PlanDocument::read_for(&json, &reads).expect("the plan reads"));
        let own = (lint(&plan, &[]), Fingerprint::of(&plan, b"bench-key"));
        (doc.join().expect("read"), own.0, own.1)
    });
    let overlapped = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    let _ = evaluate_document(&doc, &findings, "fleet", &sets);
    let after_checks = t.elapsed().as_secs_f64() * 1e3;
    let _ = writeln!(
        std::io::stderr().lock(),
        "policy bench: the sets one after the other {one_by_one:.1} ms (side by side: {:.1} ms); in the plan run: lint + fingerprint {own_checks:.1} ms alone, {overlapped:.1} ms with the document read beside them, then the sets {after_checks:.1} ms: {:.1} ms added to the plan run",
        policies.as_secs_f64() * 1e3,
        overlapped - own_checks + after_checks,
    );

    let mut c = Criterion::default().sample_size(10).configure_from_args();
    c.bench_function(&format!("policy evaluate 2 sets, {n} resources"), |b| {
        b.iter(|| black_box(evaluate(&input, &sets)))
    });
    c.bench_function(
        &format!("policy: the plan read into the interpreter, {n} resources"),
        |b| b.iter(|| black_box(PlanDocument::read_for(&json, &reads))),
    );
    c.bench_function(&format!("planbot render path, {n} resources"), |b| {
        b.iter(|| {
            black_box(report(
                &plan,
                &NoteContext::default(),
                &Secrets::new(),
                b"bench-key",
                Format::Markdown,
            ))
        })
    });
    c.final_summary();
}
