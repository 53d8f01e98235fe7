//! The checks run beside an MR's plan, in its sandbox, with its environment and bounds:
//! `validate -json`, `fmt -check -list=true -recursive` and, when the root has test files,
//! `test -json` ([`EngineChecks`]), and the warnings the plan itself gave. What they printed is
//! read by `core::engine_checks`.

use super::error::Step;
use super::process::{Capture, StepCall};
use super::Engine;
use crate::core::engine_checks::{CheckSet, PlanWarnings, StepCheck};
use crate::core::redact::Scrubber;
use std::ffi::OsString;
use std::path::Path;
use std::time::Instant;

/// What the checks of one plan run gave, each as the engine printed it (raw), and the
/// scrubber of the run (every secret it knows, the plan's own included) to redact what is read
/// of them.
#[derive(Debug, Clone)]
pub struct EngineChecks {
    pub validate: StepCheck,
    pub fmt: StepCheck,
    pub test: StepCheck,
    /// The warnings `plan -json` gave (read as it ran, also when it failed; raw).
    pub plan: PlanWarnings,
    pub scrubber: Scrubber,
}

/// The endings of the test files both engines read.
const TEST_FILE_ENDINGS: &[&str] = &[".tftest.hcl", ".tftest.json"];
/// The endings only OpenTofu reads besides.
const TOFU_TEST_FILE_ENDINGS: &[&str] = &[".tofutest.hcl", ".tofutest.json"];

/// Whether `dir` (a root) or its `tests/` holds a test file the engine reads (`tofu`: OpenTofu's
/// own endings too): what `test` reads by default. Only regular files count (a symbolic link is
/// not followed).
pub(super) fn has_test_files(dir: &Path, tofu: bool) -> bool {
    let ours = |name: &str| {
        TEST_FILE_ENDINGS.iter().any(|end| name.ends_with(end))
            || (tofu && TOFU_TEST_FILE_ENDINGS.iter().any(|end| name.ends_with(end)))
    };
    [dir.to_path_buf(), dir.join("tests")].iter().any(|d| {
        std::fs::read_dir(d).is_ok_and(|entries| {
            entries.flatten().any(|e| {
                ours(&e.file_name().to_string_lossy()) && e.file_type().is_ok_and(|t| t.is_file())
            })
        })
    })
}

impl Default for EngineChecks {
    /// Nothing asked: every check off.
    fn default() -> EngineChecks {
        EngineChecks::pending(CheckSet::NONE, false, "")
    }
}

impl EngineChecks {
    /// Before anything ran: each check on is "not run" (the plan run stopped before them, with
    /// `why`), and `test` is quiet when the root has no test files.
    pub(super) fn pending(set: CheckSet, has_tests: bool, why: &str) -> EngineChecks {
        let not_run = |on: bool| {
            if on {
                StepCheck::NotRun(why.to_string())
            } else {
                StepCheck::Off
            }
        };
        EngineChecks {
            validate: not_run(set.validate),
            fmt: not_run(set.fmt),
            test: if set.test && !has_tests {
                StepCheck::NoTests
            } else {
                not_run(set.test)
            },
            plan: PlanWarnings::default(),
            scrubber: Scrubber::none(),
        }
    }
}

impl Engine {
    /// Run one check step with its own deadline (the engine's timeout from now), in the plan
    /// run's directory, environment, sandbox and disk quota; its stdout (at most
    /// `engine.max_plan_json_mib`) is its result whatever its exit code.
    pub(super) async fn run_check(
        &self,
        step: Step,
        args: Vec<OsString>,
        call: &StepCall<'_>,
    ) -> StepCheck {
        let call = StepCall {
            deadline: Instant::now() + self.inner.timeout,
            cancel: call.cancel.clone(),
            ..*call
        };
        match self
            .run_step(step, &args, Capture::Verdict, &call, &mut |_| {})
            .await
        {
            Ok(out) => StepCheck::Ran {
                exit: out.exit,
                stdout: out.stdout,
            },
            Err(e) => StepCheck::NotRun(e.why_not(step)),
        }
    }
}
