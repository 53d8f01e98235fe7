//! `planbot policy test PLAN_JSON --policy DIR`: a directory of Rego policies evaluated over a
//! `show -json` document, printed as conftest prints it; also run by `planbot plan --policy`.
//!
//! Exit codes: 0 no failure (warnings allowed), 1 a policy failed, 2 the input is not a plan or
//! the policies could not be read or evaluated (a symbolic link, a parse error, no rule in the
//! package, the time limit).

use crate::core::plan::Plan;
use crate::core::policy::{self, PlanInput, PolicySet};
use crate::core::proxmox::lint::lint;
use crate::core::redact::{Scrubber, Secrets};
use crate::flows::context::policy_sets::read_policy_dir;
use anyhow::{Context, Result};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

/// How results are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// conftest's text: `FAIL - file - main - msg` lines and the summary.
    Text,
    /// conftest's JSON list.
    Json,
}

/// Which policies, read how.
#[derive(Debug, Clone)]
pub struct PolicyOptions {
    pub dir: PathBuf,
    pub namespace: String,
    pub limit: Duration,
    pub output: Output,
}

/// `planbot policy test`.
pub fn test_command(plan_json: &Path, root: &str, options: &PolicyOptions) -> Result<ExitCode> {
    let (name, text) = if plan_json == Path::new("-") {
        let mut text = String::new();
        std::io::stdin()
            .lock()
            .read_to_string(&mut text)
            .context("cannot read the plan from stdin")?;
        ("-".to_string(), text)
    } else {
        let text = std::fs::read_to_string(plan_json)
            .with_context(|| format!("cannot read {}", plan_json.display()))?;
        (plan_json.display().to_string(), text)
    };
    let plan = match Plan::from_json(text.as_bytes()) {
        Ok(plan) => plan,
        Err(e) => {
            let shown = if name == "-" { "stdin" } else { &name };
            eprintln!("planbot: {shown} is {e}");
            return Ok(ExitCode::from(2));
        }
    };
    let scrubber = Secrets::from_plan(&plan).scrubber();
    let report = PlanReport {
        filename: &name,
        plan_json: &text,
        plan: &plan,
        root,
        scrubber: &scrubber,
    };
    check_and_print(&report, options, &mut std::io::stdout().lock())
}

/// The plan the policies check, and what its output is scrubbed with.
pub struct PlanReport<'a> {
    /// The name conftest prints (`-` for stdin).
    pub filename: &'a str,
    pub plan_json: &'a str,
    pub plan: &'a Plan,
    pub root: &'a str,
    /// Every secret the plan reveals (a message may quote a sensitive value).
    pub scrubber: &'a Scrubber,
}

/// Evaluate the policies of `options` over one plan and print the result (errors on stderr).
/// The exit code as the module says.
pub fn check_and_print(
    report: &PlanReport<'_>,
    options: &PolicyOptions,
    out: &mut dyn Write,
) -> Result<ExitCode> {
    let files = match read_policy_dir(&options.dir) {
        Ok(files) => files,
        Err(e) => {
            eprintln!("planbot: {e:#}");
            return Ok(ExitCode::from(2));
        }
    };
    let set = PolicySet {
        name: options.dir.display().to_string(),
        namespace: options.namespace.clone(),
        files,
        limit: options.limit,
    };
    let findings = lint(report.plan, &[]);
    let input = PlanInput {
        plan_json: report.plan_json,
        findings: &findings,
        root: report.root,
    };
    let verdict = policy::evaluate(&input, std::slice::from_ref(&set));
    if verdict.has_errors() {
        let errors = policy::render_errors(&verdict);
        eprint!("{}", report.scrubber.scrub(&errors));
        return Ok(ExitCode::from(2));
    }
    let text = match options.output {
        Output::Text => report
            .scrubber
            .scrub(&policy::conftest_text(report.filename, &verdict))
            .into_owned(),
        Output::Json => policy::conftest_json(report.filename, &verdict, report.scrubber) + "\n",
    };
    out.write_all(text.as_bytes())
        .context("cannot write to stdout")?;
    Ok(if verdict.blocks() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
