//! conftest's two outputs of a verdict: its text (`FAIL - file - main - msg` lines and the
//! `N tests, N passed, …` summary, from `templates/policy_test.txt.j2`) and its JSON (a list of
//! `{"filename", "namespace", "successes", "warnings", "failures", "exceptions"}`, empty lists
//! left out and indented with tabs, as conftest writes it). Only sets that could be evaluated
//! appear; the caller reports the others ([`render_errors`]).

use super::{Message, Verdict};
use crate::core::redact::Scrubber;
use serde::Serialize;

#[derive(Serialize)]
struct CheckResult<'a> {
    filename: &'a str,
    namespace: &'a str,
    successes: usize,
    #[serde(skip_serializing_if = "<[Message]>::is_empty")]
    warnings: &'a [Message],
    #[serde(skip_serializing_if = "<[Message]>::is_empty")]
    failures: &'a [Message],
    #[serde(skip_serializing_if = "<[Message]>::is_empty")]
    exceptions: &'a [Message],
}

fn check_results<'a>(filename: &'a str, verdict: &'a Verdict) -> Vec<CheckResult<'a>> {
    verdict
        .sets
        .iter()
        .filter_map(|s| {
            s.results().map(|r| CheckResult {
                filename,
                namespace: &s.namespace,
                successes: r.successes,
                warnings: &r.warnings,
                failures: &r.failures,
                exceptions: &r.exceptions,
            })
        })
        .collect()
}

/// conftest's `--output json` (`-` as the file name is written as `""`, as conftest does),
/// every string in it scrubbed by `scrubber`.
pub fn conftest_json(filename: &str, verdict: &Verdict, scrubber: &Scrubber) -> String {
    let shown = if filename == "-" { "" } else { filename };
    scrubber.pretty_json(&check_results(shown, verdict), b"\t")
}

/// conftest's text output: warnings, failures, exceptions per set, then the summary.
pub fn conftest_text(filename: &str, verdict: &Verdict) -> String {
    let results = check_results(filename, verdict);
    let mut totals = [0usize; 4];
    for r in &results {
        totals[0] += r.successes;
        totals[1] += r.warnings.len();
        totals[2] += r.failures.len();
        totals[3] += r.exceptions.len();
    }
    render(minijinja::context! {
        indicator => if filename == "-" { "-".to_string() } else { format!("- {filename}") },
        results => results,
        tests => totals.iter().sum::<usize>(),
        passed => totals[0],
        warnings => totals[1],
        failures => totals[2],
        exceptions => totals[3],
    })
}

/// The sets that could not be evaluated, each with what stopped it (for stderr).
pub fn render_errors(verdict: &Verdict) -> String {
    let errors: Vec<minijinja::Value> = verdict
        .sets
        .iter()
        .filter_map(|s| {
            s.error().map(|e| {
                minijinja::context! { name => s.name, namespace => s.namespace, error => e.to_string() }
            })
        })
        .collect();
    render(minijinja::context! { errors => errors })
}

fn render(ctx: minijinja::Value) -> String {
    crate::core::templates::render("policy_test.txt.j2", ctx)
        .unwrap_or_else(|e| format!("(template policy_test.txt.j2 failed: {e})\n"))
}
