//! What the engine says of a root besides its plan (docs/workflow.md, "Tests, format,
//! validation and warnings"): `validate -json`'s diagnostics, `fmt -check -list`'s files,
//! `test -json`'s runs, the lines of `plan -json` (its machine-readable view: read back into
//! the human log, its warnings kept, [`view_line`]), and the warnings (validate's and the
//! plan's, each once, grouped, and the plan's failing `check` blocks), read into what the plan
//! note and the `planbot/test` status show. Pure: the engine runs them
//! (`capabilities::engine`), this reads what it printed.

use crate::core::redact::Scrubber;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Which of a root's checks run (`.planbot.toml`'s `checks = { … }`; every one by default).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckSet {
    pub validate: bool,
    pub fmt: bool,
    pub test: bool,
}

impl CheckSet {
    /// Every check: what a root runs unless its `checks` says otherwise.
    pub const ALL: CheckSet = CheckSet {
        validate: true,
        fmt: true,
        test: true,
    };

    /// No check (the drift check's and the apply's plans, `planbot plan`, the destroy of a
    /// retired root: its code is not the change under review).
    pub const NONE: CheckSet = CheckSet {
        validate: false,
        fmt: false,
        test: false,
    };
    /// The keys of `checks = { … }`, in the order the docs give them.
    pub const KEYS: [&'static str; 3] = ["validate", "fmt", "test"];
}

impl Default for CheckSet {
    fn default() -> CheckSet {
        CheckSet::ALL
    }
}

/// What one check step of the engine gave (kept by the engine runner, read here).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum StepCheck {
    /// Switched off for the root.
    #[default]
    Off,
    /// `test` only: the root has no test files (`*.tftest.hcl`, `*.tftest.json`, and for
    /// OpenTofu `*.tofutest.hcl`, `*.tofutest.json`, in the root or its `tests/`), so nothing
    /// ran.
    NoTests,
    /// It should have run and did not, or stopped before its end: why, in words.
    NotRun(String),
    /// It ran to its end: its exit code and what it printed on stdout (raw, unredacted).
    Ran { exit: Option<i32>, stdout: Vec<u8> },
    /// `validate` only: not run, as the plan ran cleanly and the engine validates the whole
    /// configuration before it plans (a validation error fails the plan); its warnings are the
    /// plan's. Only for a root without test files (`validate` reads those too, the plan not).
    ByThePlan,
}

/// A diagnostic of the engine, reduced to what a note shows: one line each.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Diagnostic {
    pub severity: Severity,
    pub summary: String,
    /// The detail on one line (whitespace runs folded), empty when there is none.
    pub detail: String,
    /// `file:line` of the diagnostic's range, when it has one.
    pub at: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Error,
    Warning,
}

/// How a test run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TestStatus {
    Pass,
    Fail,
    Error,
    Skip,
    /// Started and never said how it ended (the engine stopped).
    Pending,
}

/// One `run` block of a test file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TestRun {
    pub file: String,
    pub run: String,
    pub status: TestStatus,
    /// The errors of the run: a failed assertion's message and where it is.
    pub problems: Vec<Diagnostic>,
}

/// What `test -json` said.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TestReport {
    pub runs: Vec<TestRun>,
    /// Errors outside any run (a test file that does not load).
    pub errors: Vec<Diagnostic>,
    pub passed: usize,
    pub failed: usize,
    pub errored: usize,
    pub skipped: usize,
}

impl TestReport {
    /// No run failed or errored and every test file loaded.
    pub fn ok(&self) -> bool {
        self.failed == 0 && self.errored == 0 && self.errors.is_empty()
    }
}

/// One check's result as the note shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Check<T> {
    /// Off, or nothing to check: the note says nothing.
    #[default]
    Quiet,
    /// It did not run, or not to its end: why.
    NotRun {
        reason: String,
    },
    Ran {
        result: T,
    },
}

impl<T> Check<T> {
    pub fn result(&self) -> Option<&T> {
        match self {
            Check::Ran { result } => Some(result),
            _ => None,
        }
    }
}

/// A warning, listed once however often the engine gave it: its summary, then each distinct
/// detail once (a provider's "Deprecated Resource" names the type and its replacement in the
/// detail: one line per deprecated type, with how many uses).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WarningGroup {
    pub summary: String,
    /// How many times the engine gave it, all details together.
    pub count: usize,
    pub details: Vec<WarningDetail>,
}

/// One detail of a warning group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WarningDetail {
    pub detail: String,
    /// How many times the engine gave this detail (one per place).
    pub count: usize,
    /// The first places it was given at (`file:line`), at most [`PLACES_LISTED`].
    pub at: Vec<String>,
}

/// A `check {}` block whose assertions failed (or could not be evaluated) in the plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckBlock {
    /// `check.health`, or the instance's address when it has several.
    pub address: String,
    /// `fail` or `error`.
    pub status: String,
    pub messages: Vec<String>,
}

/// At most this many places are listed for a warning group.
pub const PLACES_LISTED: usize = 5;

/// At most this many entries of each list are shown (files, diagnostics, runs); the rest are
/// counted.
pub const LISTED: usize = 50;

/// Everything the checks of one root said.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RootChecks {
    /// `validate -json`'s errors (its warnings go to `warnings`).
    pub validate: Check<Vec<Diagnostic>>,
    /// `fmt -check -list`: the files not formatted.
    pub fmt: Check<Vec<String>>,
    pub test: Check<TestReport>,
    /// The engine's warnings, each once: `validate -json`'s and the plan's.
    pub warnings: Vec<WarningGroup>,
    /// Warnings the plan gave past the [`PLAN_WARNINGS_KEPT`] different ones planbot keeps:
    /// counted, not read.
    pub warnings_unread: usize,
    /// The plan's failing `check {}` blocks.
    pub check_blocks: Vec<CheckBlock>,
}

impl RootChecks {
    /// Read what the engine's check steps printed, the warnings its `plan` gave, and the
    /// failing `check` blocks of the plan (its `checks`, [`crate::core::plan::Plan::checks_json`],
    /// when there is a plan).
    ///
    /// The warnings are validation's: with `validate` switched off, none are shown (the
    /// plan's neither). A warning both `validate` and `plan` give (same summary, detail and
    /// place) is counted as often as the one that gave it most often, not once per command.
    pub fn read(
        validate: &StepCheck,
        fmt: &StepCheck,
        test: &StepCheck,
        plan: &PlanWarnings,
        checks_json: Option<&[u8]>,
    ) -> RootChecks {
        let mut warnings = Vec::new();
        let validate = match validate {
            StepCheck::Ran { stdout, exit } => match read_validate(stdout) {
                Some(diags) => {
                    let (errors, warns): (Vec<_>, Vec<_>) = diags
                        .into_iter()
                        .partition(|d| d.severity == Severity::Error);
                    warnings = warns;
                    Check::Ran { result: errors }
                }
                None => Check::NotRun {
                    reason: format!(
                        "`validate -json` printed no validation result ({})",
                        exit_text(*exit)
                    ),
                },
            },
            StepCheck::ByThePlan => Check::Ran { result: Vec::new() },
            other => quiet_or_not_run(other),
        };
        let fmt = fmt_check(fmt);
        let test = match test {
            StepCheck::Ran { stdout, exit } => {
                let report = read_test(stdout);
                if report.runs.is_empty() && report.errors.is_empty() {
                    Check::NotRun {
                        reason: format!("`test -json` reported no test run ({})", exit_text(*exit)),
                    }
                } else {
                    Check::Ran { result: report }
                }
            }
            other => quiet_or_not_run(other),
        };
        let check_blocks = checks_json.map(read_check_blocks);
        let (warnings, warnings_unread) = if matches!(validate, Check::Quiet) {
            (Vec::new(), 0)
        } else {
            (
                merge_warnings(&warnings, plan, check_blocks.is_some()),
                plan.unread,
            )
        };
        RootChecks {
            validate,
            fmt,
            test,
            warnings,
            warnings_unread,
            check_blocks: check_blocks.unwrap_or_default(),
        }
    }

    /// Whether anything is to be shown.
    pub fn is_quiet(&self) -> bool {
        matches!(self.validate, Check::Quiet | Check::Ran { .. })
            && self.validate.result().is_none_or(Vec::is_empty)
            && matches!(self.fmt, Check::Quiet | Check::Ran { .. })
            && self.fmt.result().is_none_or(Vec::is_empty)
            && matches!(self.test, Check::Quiet)
            && self.warnings.is_empty()
            && self.warnings_unread == 0
            && self.check_blocks.is_empty()
    }

    /// Every text in it with `scrubber`'s secrets replaced (it came from the engine).
    pub fn scrubbed(mut self, scrubber: &Scrubber) -> RootChecks {
        let s = |t: &mut String| {
            if let std::borrow::Cow::Owned(o) = scrubber.scrub(t) {
                *t = o;
            }
        };
        let diag = |d: &mut Diagnostic| {
            s(&mut d.summary);
            s(&mut d.detail);
            if let Some(a) = &mut d.at {
                s(a);
            }
        };
        match &mut self.validate {
            Check::Ran { result } => result.iter_mut().for_each(diag),
            Check::NotRun { reason } => s(reason),
            Check::Quiet => {}
        }
        match &mut self.fmt {
            Check::Ran { result } => result.iter_mut().for_each(s),
            Check::NotRun { reason } => s(reason),
            Check::Quiet => {}
        }
        match &mut self.test {
            Check::Ran { result } => {
                for r in &mut result.runs {
                    s(&mut r.file);
                    s(&mut r.run);
                    r.problems.iter_mut().for_each(diag);
                }
                result.errors.iter_mut().for_each(diag);
            }
            Check::NotRun { reason } => s(reason),
            Check::Quiet => {}
        }
        for w in &mut self.warnings {
            s(&mut w.summary);
            for d in &mut w.details {
                s(&mut d.detail);
                d.at.iter_mut().for_each(s);
            }
        }
        for c in &mut self.check_blocks {
            s(&mut c.address);
            c.messages.iter_mut().for_each(s);
        }
        self
    }
}

/// What the `planbot/test` status of an MR head says: the tests of every root that has some.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TestsStatus {
    /// Every root's tests ran and none failed or errored.
    pub ok: bool,
    /// Roots whose tests ran.
    pub roots: usize,
    pub passed: usize,
    pub failed: usize,
    pub errored: usize,
    pub skipped: usize,
    /// Roots with failing or erroring tests, in order.
    pub failing: Vec<String>,
    /// Roots whose tests should have run and did not.
    pub not_run: Vec<String>,
}

impl TestsStatus {
    /// The status of these roots' tests; `None` when no root has tests to run (none has test
    /// files, or every root with some switched them off): then nothing is posted.
    pub fn of<'a>(
        roots: impl IntoIterator<Item = (&'a str, &'a RootChecks)>,
    ) -> Option<TestsStatus> {
        let mut st = TestsStatus::default();
        let mut any = false;
        for (name, c) in roots {
            match &c.test {
                Check::Quiet => {}
                Check::NotRun { .. } => {
                    any = true;
                    st.not_run.push(name.to_string());
                }
                Check::Ran { result } => {
                    any = true;
                    st.roots += 1;
                    st.passed += result.passed;
                    st.failed += result.failed;
                    st.errored += result.errored;
                    st.skipped += result.skipped;
                    if !result.ok() {
                        st.failing.push(name.to_string());
                    }
                }
            }
        }
        st.ok = st.failing.is_empty() && st.not_run.is_empty();
        any.then_some(st)
    }
}

/// What `fmt -check -list` said: the files not formatted, or why it could not tell.
pub fn fmt_check(step: &StepCheck) -> Check<Vec<String>> {
    match step {
        // 0: every file is formatted; 3: `-check` found some that are not.
        StepCheck::Ran {
            exit: Some(0 | 3),
            stdout,
        } => Check::Ran {
            result: read_fmt(stdout),
        },
        StepCheck::Ran { exit, .. } => Check::NotRun {
            reason: format!(
                "`fmt -check` could not read every file ({}): a file it cannot parse is shown by `validate`",
                exit_text(*exit)
            ),
        },
        other => quiet_or_not_run(other),
    }
}

fn quiet_or_not_run<T>(step: &StepCheck) -> Check<T> {
    match step {
        StepCheck::NotRun(reason) => Check::NotRun {
            reason: reason.clone(),
        },
        _ => Check::Quiet,
    }
}

fn exit_text(exit: Option<i32>) -> String {
    match exit {
        Some(c) => format!("exit code {c}"),
        None => "killed by a signal".to_string(),
    }
}

// ----- the engine's JSON ---------------------------------------------------------------------

#[derive(Deserialize)]
struct WireDiagnostic {
    #[serde(default)]
    severity: String,
    #[serde(default)]
    summary: String,
    #[serde(default)]
    detail: String,
    #[serde(default)]
    range: Option<WireRange>,
    /// Its `context` (the enclosing block's header) and `code` (the source lines) are read;
    /// its `values` (what the expression's references held) are never shown.
    #[serde(default)]
    snippet: Option<WireSnippet>,
}

#[derive(Deserialize)]
struct WireSnippet {
    #[serde(default)]
    context: Option<String>,
    #[serde(default)]
    code: Option<String>,
    #[serde(default)]
    start_line: u64,
}

#[derive(Deserialize)]
struct WireRange {
    #[serde(default)]
    filename: String,
    #[serde(default)]
    start: Option<WirePos>,
}

#[derive(Deserialize)]
struct WirePos {
    #[serde(default)]
    line: u64,
}

/// A detail longer than this many characters is cut (the note lists many).
const DETAIL_MAX_CHARS: usize = 1000;

/// Whitespace runs (line breaks included) as one space, at most [`DETAIL_MAX_CHARS`]: a
/// detail is shown on one line.
fn one_line(text: &str) -> String {
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match line.char_indices().nth(DETAIL_MAX_CHARS) {
        Some((at, _)) => format!("{} …", &line[..at]),
        None => line,
    }
}

impl WireDiagnostic {
    fn read(self) -> Diagnostic {
        Diagnostic {
            severity: if self.severity == "warning" {
                Severity::Warning
            } else {
                Severity::Error
            },
            summary: one_line(&self.summary),
            detail: one_line(&self.detail),
            at: self.range.filter(|r| !r.filename.is_empty()).map(|r| {
                match r.start.map(|p| p.line).filter(|l| *l > 0) {
                    Some(line) => format!("{}:{line}", r.filename),
                    None => r.filename,
                }
            }),
        }
    }
}

/// At most this many different warnings (summary, detail and place) of one plan are kept; more
/// are counted ([`PlanWarnings::unread`]) and the note says so.
pub const PLAN_WARNINGS_KEPT: usize = 1000;

/// The warnings `plan -json` gave: each different one (summary, detail, place) once, with how
/// often it was given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PlanWarnings {
    given: BTreeMap<(String, String, Option<String>), usize>,
    /// Warnings past [`PLAN_WARNINGS_KEPT`] different ones: counted, not kept.
    pub unread: usize,
}

impl PlanWarnings {
    /// Keep `d` if it is a warning (the plan's errors are its failure, shown with it).
    pub fn add(&mut self, d: Diagnostic) {
        if d.severity != Severity::Warning {
            return;
        }
        let key = (d.summary, d.detail, d.at);
        if let Some(n) = self.given.get_mut(&key) {
            *n += 1;
        } else if self.given.len() < PLAN_WARNINGS_KEPT {
            self.given.insert(key, 1);
        } else {
            self.unread += 1;
        }
    }

    /// Whether the plan gave no warning.
    pub fn is_empty(&self) -> bool {
        self.given.is_empty() && self.unread == 0
    }
}

/// One line of the engine's machine-readable view (`plan -json`), read: the text its human
/// view prints for it, and its diagnostic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewLine {
    /// The human lines: the line's `@message`; for a diagnostic, "Error: …" or "Warning: …",
    /// its place (`on main.tf line 3, in resource "x" "y":`) and its detail as given. A line
    /// that is not the view's JSON (stderr, a line cut at the length bound) is kept as it is.
    pub text: Vec<String>,
    pub diagnostic: Option<Diagnostic>,
}

/// Read one line `plan -json` printed (at most the line bound the engine runner reads). Of a
/// diagnostic's snippet, the source lines are shown as the human view shows them, never the
/// values its references held (the human view prints those too); the text holds whatever the
/// engine put in a message, a detail or the source, and is redacted with the run's log.
pub fn view_line(line: &str) -> ViewLine {
    #[derive(Deserialize)]
    struct Wire {
        #[serde(default, rename = "@message")]
        message: Option<String>,
        #[serde(default)]
        diagnostic: Option<WireDiagnostic>,
    }
    let raw = || ViewLine {
        text: vec![line.to_string()],
        diagnostic: None,
    };
    if !line.trim_start().starts_with('{') {
        return raw();
    }
    let Ok(wire) = serde_json::from_str::<Wire>(line) else {
        return raw();
    };
    let Some(d) = wire.diagnostic else {
        return match wire.message {
            Some(m) => ViewLine {
                text: m.lines().map(str::to_string).collect(),
                diagnostic: None,
            },
            None => raw(),
        };
    };
    // As the human view prints it (`-no-color`), without the source snippet.
    let mut text = vec![String::new()];
    let label = if d.severity == "warning" {
        "Warning"
    } else {
        "Error"
    };
    let mut summary = d.summary.lines();
    text.push(format!("{label}: {}", summary.next().unwrap_or("")));
    text.extend(summary.map(str::to_string));
    if let Some(r) = d.range.as_ref().filter(|r| !r.filename.is_empty()) {
        let line_no = r.start.as_ref().map_or(0, |p| p.line);
        let context = d
            .snippet
            .as_ref()
            .and_then(|s| s.context.as_deref())
            .filter(|c| !c.is_empty())
            .map(|c| format!(", in {}", c.lines().next().unwrap_or("")))
            .unwrap_or_default();
        text.push(String::new());
        text.push(format!("  on {} line {line_no}{context}:", r.filename));
        // The source lines, numbered as the human view numbers them.
        if let Some(s) = d.snippet.as_ref().filter(|s| s.start_line > 0) {
            let code = s.code.as_deref().unwrap_or("");
            for (i, l) in code.lines().enumerate() {
                text.push(format!("{:4}: {l}", s.start_line + i as u64));
            }
        }
    }
    if !d.detail.trim().is_empty() {
        text.push(String::new());
        text.extend(d.detail.trim_end().lines().map(str::to_string));
    }
    ViewLine {
        text,
        diagnostic: Some(d.read()),
    }
}

/// The summary of the warning each failing `check {}` assertion gives at plan time (both
/// engines): the note lists these from the plan's `checks` instead.
const CHECK_BLOCK_WARNING: &str = "Check block assertion failed";

/// `validate`'s warnings and the plan's, grouped ([`group_warnings`]): a warning both give
/// (same summary, detail and place) counts as often as the one that gave it most often (each
/// is given once per place, the plan repeats what validation found); warnings only the plan
/// gives are added. With `checks_read` (the plan's `checks` were read), the plan's "Check block
/// assertion failed" warnings are left out: each failing `check {}` is listed once, from the
/// plan's `checks`, which name the block and say `fail` or `error`.
fn merge_warnings(
    validate: &[Diagnostic],
    plan: &PlanWarnings,
    checks_read: bool,
) -> Vec<WarningGroup> {
    let mut by_validate: BTreeMap<(&str, &str, Option<&str>), usize> = BTreeMap::new();
    for w in validate {
        *by_validate
            .entry((&w.summary, &w.detail, w.at.as_deref()))
            .or_default() += 1;
    }
    let mut counted: Vec<(&Diagnostic, usize)> = validate.iter().map(|w| (w, 1)).collect();
    let plan_only: Vec<(Diagnostic, usize)> = plan
        .given
        .iter()
        .filter(|((summary, ..), _)| !(checks_read && summary == CHECK_BLOCK_WARNING))
        .filter_map(|((summary, detail, at), n)| {
            let seen = by_validate
                .get(&(summary.as_str(), detail.as_str(), at.as_deref()))
                .copied()
                .unwrap_or(0);
            (*n > seen).then(|| {
                (
                    Diagnostic {
                        severity: Severity::Warning,
                        summary: summary.clone(),
                        detail: detail.clone(),
                        at: at.clone(),
                    },
                    n - seen,
                )
            })
        })
        .collect();
    counted.extend(plan_only.iter().map(|(d, n)| (d, *n)));
    group_counted(&counted)
}

/// `validate -json`'s diagnostics; `None` when it is not its document.
fn read_validate(stdout: &[u8]) -> Option<Vec<Diagnostic>> {
    #[derive(Deserialize)]
    struct Validate {
        valid: bool,
        #[serde(default)]
        diagnostics: Vec<WireDiagnostic>,
    }
    let v: Validate = serde_json::from_slice(stdout).ok()?;
    let _ = v.valid;
    Some(
        v.diagnostics
            .into_iter()
            .map(WireDiagnostic::read)
            .collect(),
    )
}

/// The names of the files planbot writes into a root's checkout beside the repository's: the
/// state overrides of `core::state` (its tests hold them to this list). They are no file of the
/// MR: the remote-state one keeps each block's `config` as the code wrote it, so it is
/// formatted only when that was.
pub const PLANBOT_FILES: [&str; 2] = [
    "planbot_state_override.tf",
    "planbot_remote_state_override.tf",
];

/// The arguments of `fmt -check`: run in a root's directory (`dirs` empty), or once over
/// several roots' directories of a checkout from its top (`dirs`: repo-relative, `.` the top;
/// each after `--`, so none is read as a flag).
pub fn fmt_check_args(dirs: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = ["fmt", "-check", "-list=true", "-recursive", "-no-color"]
        .into_iter()
        .map(String::from)
        .collect();
    if !dirs.is_empty() {
        args.push("--".into());
        args.extend(dirs.iter().map(|d| d.to_string()));
    }
    args
}

/// The endings of the files `fmt` reads with both engines (OpenTofu reads `.tofu` and
/// `.tofutest.hcl` besides, Terraform refuses them as arguments).
pub const FMT_FILE_ENDINGS: [&str; 3] = [".tf", ".tfvars", ".tftest.hcl"];

/// Of what a `fmt -check` over several roots' directories and some files listed
/// ([`fmt_check_args`]), the files under none of those directories (`dirs`; `.` holds every
/// file), each once and not planbot's own ([`PLANBOT_FILES`]): the files outside the roots it
/// was given. Nothing when it gave no list.
pub fn fmt_outside(of_roots: &StepCheck, dirs: &[&str]) -> Vec<String> {
    let StepCheck::Ran {
        exit: Some(0 | 3),
        stdout,
    } = of_roots
    else {
        return Vec::new();
    };
    let under = |path: &str, dir: &str| {
        *dir == *"."
            || path
                .strip_prefix(dir)
                .is_some_and(|rest| rest.starts_with('/'))
    };
    let mut outside: Vec<String> = Vec::new();
    for path in read_fmt(stdout) {
        if !dirs.iter().any(|d| under(&path, d)) && !outside.contains(&path) {
            outside.push(path);
        }
    }
    outside
}

/// One root's share of a `fmt -check` over several roots' directories ([`fmt_check_args`]):
/// what `fmt -check -list=true -recursive` run in `dir` alone would have given, the files
/// listed under `dir` relative to it, each once (a file under two nested roots' directories is
/// listed twice). `None` when that run gave no list to share (it failed, as on a file it cannot
/// parse, or did not run): the root runs its own.
pub fn fmt_share(of_roots: &StepCheck, dir: &str) -> Option<StepCheck> {
    let StepCheck::Ran {
        exit: Some(0 | 3),
        stdout,
    } = of_roots
    else {
        return None;
    };
    let text = String::from_utf8_lossy(stdout);
    let mut listed: Vec<&str> = Vec::new();
    for line in text.lines() {
        let path = line.trim();
        let own = match dir {
            "." => Some(path),
            _ => path
                .strip_prefix(dir)
                .and_then(|rest| rest.strip_prefix('/')),
        };
        if let Some(own) = own.filter(|p| !p.is_empty()) {
            if !listed.contains(&own) {
                listed.push(own);
            }
        }
    }
    let mut stdout = String::new();
    for path in &listed {
        stdout.push_str(path);
        stdout.push('\n');
    }
    Some(StepCheck::Ran {
        exit: Some(if listed.is_empty() { 0 } else { 3 }),
        stdout: stdout.into_bytes(),
    })
}

/// `fmt -list`'s files, one a line, but planbot's own ([`PLANBOT_FILES`]).
fn read_fmt(stdout: &[u8]) -> Vec<String> {
    let planbot_file =
        |path: &str| PLANBOT_FILES.contains(&path.rsplit('/').next().unwrap_or(path));
    String::from_utf8_lossy(stdout)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !planbot_file(l))
        .map(str::to_string)
        .collect()
}

/// `test -json`'s lines: each run's end and its errors, the summary's counts.
fn read_test(stdout: &[u8]) -> TestReport {
    #[derive(Deserialize)]
    struct Line {
        #[serde(default, rename = "type")]
        kind: String,
        #[serde(default, rename = "@testfile")]
        file: Option<String>,
        #[serde(default, rename = "@testrun")]
        run: Option<String>,
        #[serde(default)]
        test_run: Option<WireRun>,
        #[serde(default)]
        diagnostic: Option<WireDiagnostic>,
    }
    #[derive(Deserialize)]
    struct WireRun {
        #[serde(default)]
        path: String,
        #[serde(default)]
        run: String,
        #[serde(default)]
        progress: String,
        #[serde(default)]
        status: Option<String>,
    }
    let mut report = TestReport::default();
    let mut index: BTreeMap<(String, String), usize> = BTreeMap::new();
    for line in stdout.split(|b| *b == b'\n') {
        let Ok(line) = serde_json::from_slice::<Line>(line) else {
            continue;
        };
        match line.kind.as_str() {
            "test_run" => {
                let Some(r) = line.test_run else { continue };
                let status = match (r.progress.as_str(), r.status.as_deref()) {
                    ("complete", Some("pass")) => TestStatus::Pass,
                    ("complete", Some("fail")) => TestStatus::Fail,
                    ("complete", Some("skip")) => TestStatus::Skip,
                    ("complete", _) => TestStatus::Error,
                    _ => TestStatus::Pending,
                };
                let key = (r.path.clone(), r.run.clone());
                match index.get(&key) {
                    Some(&i) => report.runs[i].status = status,
                    None => {
                        index.insert(key, report.runs.len());
                        report.runs.push(TestRun {
                            file: r.path,
                            run: r.run,
                            status,
                            problems: Vec::new(),
                        });
                    }
                }
            }
            "diagnostic" => {
                let Some(d) = line.diagnostic.map(WireDiagnostic::read) else {
                    continue;
                };
                if d.severity != Severity::Error {
                    continue;
                }
                let at = line.file.zip(line.run).and_then(|k| index.get(&k).copied());
                match at {
                    Some(i) => report.runs[i].problems.push(d),
                    None => report.errors.push(d),
                }
            }
            _ => {}
        }
    }
    for r in &report.runs {
        match r.status {
            TestStatus::Pass => report.passed += 1,
            TestStatus::Fail => report.failed += 1,
            TestStatus::Error | TestStatus::Pending => report.errored += 1,
            TestStatus::Skip => report.skipped += 1,
        }
    }
    report
}

/// The warnings, each summary once and under it each of its details once, with how often and
/// where. The engine gives them in no fixed order (Terraform walks modules in parallel), so the
/// result is sorted: the most frequent warning first (then by summary), each group's details
/// by their first place (then by text), places by file and line. The same plan gives the same
/// note, and a push that changes nothing does not rewrite it.
#[cfg(test)]
fn group_warnings(warnings: &[Diagnostic]) -> Vec<WarningGroup> {
    let counted: Vec<(&Diagnostic, usize)> = warnings.iter().map(|w| (w, 1)).collect();
    group_counted(&counted)
}

/// [`group_warnings`] of warnings each given `n` times.
fn group_counted(warnings: &[(&Diagnostic, usize)]) -> Vec<WarningGroup> {
    let mut groups: Vec<WarningGroup> = Vec::new();
    for &(w, n) in warnings {
        let g = match groups.iter().position(|g| g.summary == w.summary) {
            Some(i) => &mut groups[i],
            None => {
                groups.push(WarningGroup {
                    summary: w.summary.clone(),
                    count: 0,
                    details: Vec::new(),
                });
                groups.last_mut().expect("pushed")
            }
        };
        g.count += n;
        let d = match g.details.iter().position(|d| d.detail == w.detail) {
            Some(i) => &mut g.details[i],
            None => {
                g.details.push(WarningDetail {
                    detail: w.detail.clone(),
                    count: 0,
                    at: Vec::new(),
                });
                g.details.last_mut().expect("pushed")
            }
        };
        d.count += n;
        if let Some(at) = &w.at {
            if !d.at.contains(at) {
                d.at.push(at.clone());
            }
        }
    }
    for g in &mut groups {
        for d in &mut g.details {
            d.at.sort_by(|a, b| place_key(a).cmp(&place_key(b)));
            d.at.truncate(PLACES_LISTED);
        }
        g.details.sort_by(|a, b| {
            // A detail with no place after those with one.
            let (pa, pb) = (a.at.first(), b.at.first());
            (pa.is_none(), pa.map(|p| place_key(p)), &a.detail).cmp(&(
                pb.is_none(),
                pb.map(|p| place_key(p)),
                &b.detail,
            ))
        });
    }
    groups.sort_by(|a, b| {
        b.count
            .cmp(&a.count)
            .then_with(|| a.summary.cmp(&b.summary))
    });
    groups
}

/// A `file:line` place as (file, line number), so `main.tf:9` comes before `main.tf:10`.
fn place_key(place: &str) -> (&str, u64) {
    match place.rsplit_once(':') {
        Some((file, line)) => match line.parse() {
            Ok(n) => (file, n),
            Err(_) => (place, 0),
        },
        None => (place, 0),
    }
}

/// The failing `check {}` blocks of a plan's `checks` (its JSON text, [`Plan::checks_json`]:
/// kept from the plan's one parse, the document is not read again): status `fail` or `error`,
/// with their messages. Anything but a list of check results gives none.
///
/// [`Plan::checks_json`]: crate::core::plan::Plan::checks_json
fn read_check_blocks(checks_json: &[u8]) -> Vec<CheckBlock> {
    #[derive(Deserialize)]
    struct Result_ {
        #[serde(default)]
        address: Address,
        #[serde(default)]
        status: String,
        #[serde(default)]
        instances: Vec<Instance>,
    }
    #[derive(Deserialize, Default)]
    struct Address {
        #[serde(default)]
        kind: String,
        #[serde(default)]
        to_display: String,
    }
    #[derive(Deserialize)]
    struct Instance {
        #[serde(default)]
        address: Address,
        #[serde(default)]
        status: String,
        #[serde(default)]
        problems: Vec<Problem>,
    }
    #[derive(Deserialize)]
    struct Problem {
        #[serde(default)]
        message: String,
    }
    let Ok(checks) = serde_json::from_slice::<Vec<Result_>>(checks_json) else {
        return Vec::new();
    };
    let failing = |s: &str| s == "fail" || s == "error";
    let mut out = Vec::new();
    for c in checks {
        // Only `check {}` blocks: a resource's failing condition is the plan's error.
        if c.address.kind != "check" || !failing(&c.status) {
            continue;
        }
        for i in c.instances.into_iter().filter(|i| failing(&i.status)) {
            let address = if i.address.to_display.is_empty() {
                c.address.to_display.clone()
            } else {
                i.address.to_display
            };
            out.push(CheckBlock {
                address,
                status: i.status,
                messages: i
                    .problems
                    .into_iter()
                    .map(|p| one_line(&p.message))
                    .collect(),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ran(text: &str, exit: i32) -> StepCheck {
        StepCheck::Ran {
            exit: Some(exit),
            stdout: text.as_bytes().to_vec(),
        }
    }

    #[test]
    fn tests_are_counted_per_run_with_the_failed_assertion() {
        // As terraform 1.11.4 printed it for one passing and one failing run.
        let out = r#"{"@level":"info","@message":"Found 1 file and 2 run blocks","type":"test_abstract","test_abstract":{"tests/a.tftest.hcl":["passes","fails"]}}
{"@testfile":"tests/a.tftest.hcl","@testrun":"passes","test_run":{"path":"tests/a.tftest.hcl","run":"passes","progress":"starting","elapsed":0},"type":"test_run"}
{"@testfile":"tests/a.tftest.hcl","@testrun":"passes","test_run":{"path":"tests/a.tftest.hcl","run":"passes","progress":"complete","status":"pass"},"type":"test_run"}
{"@testfile":"tests/a.tftest.hcl","@testrun":"fails","test_run":{"path":"tests/a.tftest.hcl","run":"fails","progress":"complete","status":"fail"},"type":"test_run"}
{"@level":"error","@testfile":"tests/a.tftest.hcl","@testrun":"fails","diagnostic":{"severity":"error","summary":"Test assertion failed","detail":"input is not 3","range":{"filename":"tests/a.tftest.hcl","start":{"line":11,"column":21}}},"type":"diagnostic"}
{"@message":"Failure! 1 passed, 1 failed.","test_summary":{"status":"fail","passed":1,"failed":1,"errored":0,"skipped":0},"type":"test_summary"}
"#;
        let c = RootChecks::read(
            &StepCheck::Off,
            &StepCheck::Off,
            &ran(out, 1),
            &PlanWarnings::default(),
            None,
        );
        let t = c.test.result().expect("ran");
        assert_eq!((t.passed, t.failed, t.errored), (1, 1, 0));
        assert!(!t.ok());
        assert_eq!(t.runs[1].problems[0].detail, "input is not 3");
        assert_eq!(
            t.runs[1].problems[0].at.as_deref(),
            Some("tests/a.tftest.hcl:11")
        );
    }

    #[test]
    fn planbots_own_override_files_are_not_the_mrs_files_to_format() {
        // `fmt -check -list=true -recursive` in a root whose code reads another root's state:
        // planbot's overrides there (and in a module inside the root) are not listed.
        let out = "main.tf\nplanbot_remote_state_override.tf\nplanbot_state_override.tf\n\
                   modules/dns/planbot_remote_state_override.tf\nmodules/dns/zone.tf\n";
        let c = RootChecks::read(
            &StepCheck::Off,
            &ran(out, 3),
            &StepCheck::Off,
            &PlanWarnings::default(),
            None,
        );
        assert_eq!(c.fmt.result().unwrap(), &["main.tf", "modules/dns/zone.tf"]);
        let only_ours = RootChecks::read(
            &StepCheck::Off,
            &ran("planbot_remote_state_override.tf\n", 3),
            &StepCheck::Off,
            &PlanWarnings::default(),
            None,
        );
        assert!(only_ours.is_quiet());
    }

    #[test]
    fn warnings_are_grouped_and_errors_kept_apart() {
        let w = |line: u32| {
            format!(
                r#"{{"severity":"warning","summary":"Deprecated Resource","detail":"use proxmox_vm\ninstead","range":{{"filename":"main.tf","start":{{"line":{line}}}}}}}"#
            )
        };
        let doc = format!(
            r#"{{"valid":false,"diagnostics":[{},{},{{"severity":"error","summary":"Unsupported argument","detail":"x","range":{{"filename":"a.tf","start":{{"line":4}}}}}}]}}"#,
            w(3),
            w(9)
        );
        let c = RootChecks::read(
            &ran(&doc, 1),
            &StepCheck::Off,
            &StepCheck::Off,
            &PlanWarnings::default(),
            None,
        );
        assert_eq!(c.warnings.len(), 1);
        assert_eq!(c.warnings[0].count, 2);
        assert_eq!(c.warnings[0].details.len(), 1);
        assert_eq!(c.warnings[0].details[0].detail, "use proxmox_vm instead");
        assert_eq!(c.warnings[0].details[0].at, ["main.tf:3", "main.tf:9"]);
        assert_eq!(
            c.validate.result().unwrap()[0].at.as_deref(),
            Some("a.tf:4")
        );
    }

    #[test]
    fn warnings_given_in_any_order_group_the_same() {
        // Terraform walks modules in parallel: the same plan gives its warnings in any order.
        let d = |summary: &str, detail: &str, at: &str| Diagnostic {
            severity: Severity::Warning,
            summary: summary.into(),
            detail: detail.into(),
            at: Some(at.into()),
        };
        let given = [
            d(
                "Redundant empty provider block",
                "module.two",
                "modules/m2/main.tf:1",
            ),
            d("Deprecated attribute", "use x", "main.tf:10"),
            d(
                "Redundant empty provider block",
                "module.one",
                "modules/m/main.tf:1",
            ),
            d("Deprecated attribute", "use x", "main.tf:9"),
            d(
                "Redundant empty provider block",
                "module.one",
                "modules/m/main.tf:1",
            ),
        ];
        let grouped = group_warnings(&given);
        let mut reversed = given.clone();
        reversed.reverse();
        assert_eq!(group_warnings(&reversed), grouped);
        let mut rotated = given.clone();
        rotated.rotate_left(2);
        assert_eq!(group_warnings(&rotated), grouped);
        // The most frequent first; details by first place; places by file, then line number.
        assert_eq!(grouped[0].summary, "Redundant empty provider block");
        assert_eq!(grouped[0].count, 3);
        assert_eq!(grouped[0].details[0].detail, "module.one");
        assert_eq!(grouped[0].details[0].count, 2);
        assert_eq!(grouped[0].details[1].at, ["modules/m2/main.tf:1"]);
        assert_eq!(grouped[1].details[0].at, ["main.tf:9", "main.tf:10"]);
    }

    #[test]
    fn what_did_not_run_says_so_and_what_is_off_says_nothing() {
        let c = RootChecks::read(
            &ran("not json", 1),
            &ran("", 2),
            &StepCheck::NoTests,
            &PlanWarnings::default(),
            Some(b"{}"),
        );
        assert!(matches!(c.validate, Check::NotRun { .. }));
        assert!(matches!(c.fmt, Check::NotRun { .. }));
        assert_eq!(c.test, Check::Quiet);
        let quiet = RootChecks::read(
            &StepCheck::Off,
            &ran("", 0),
            &StepCheck::NoTests,
            &PlanWarnings::default(),
            Some(b"not a plan"),
        );
        assert!(quiet.is_quiet(), "{quiet:?}");
    }

    /// Lines as terraform 1.11.4's `plan -json` printed them.
    const PLAN_LINES: &str = r#"{"@level":"info","@message":"Terraform 1.11.4","@module":"terraform.ui","@timestamp":"2026-12-06T07:35:56.512544Z","terraform":"1.11.4","type":"version","ui":"1.2"}
{"@level":"info","@message":"terraform_data.x: Plan to create","@module":"terraform.ui","@timestamp":"2026-12-06T07:35:56.531724Z","change":{"resource":{"addr":"terraform_data.x","module":"","resource":"terraform_data.x","implied_provider":"terraform","resource_type":"terraform_data","resource_name":"x","resource_key":null},"action":"create"},"type":"planned_change"}
{"@level":"info","@message":"Plan: 1 to add, 0 to change, 0 to destroy.","@module":"terraform.ui","@timestamp":"2026-12-06T07:35:56.531811Z","changes":{"add":1,"change":0,"import":0,"remove":0,"operation":"plan"},"type":"change_summary"}
{"@level":"warn","@message":"Warning: Check block assertion failed","@module":"terraform.ui","@timestamp":"2026-12-06T07:35:56.571186Z","diagnostic":{"severity":"warning","summary":"Check block assertion failed","detail":"v is not b","range":{"filename":"main.tf","start":{"line":10,"column":21,"byte":150},"end":{"line":10,"column":33,"byte":162}},"snippet":{"context":"check \"health\"","code":"    condition     = var.v == \"b\"","start_line":10,"highlight_start_offset":20,"highlight_end_offset":32,"values":[{"traversal":"var.v","statement":"is \"snippet-value\""}]}},"type":"diagnostic"}
{"@level":"warn","@message":"Warning: Value for undeclared variable","@module":"terraform.ui","@timestamp":"2026-12-06T07:37:25.010858Z","diagnostic":{"severity":"warning","summary":"Value for undeclared variable","detail":"The root module does not declare a variable named \"old_setting\" but a value was found in file \"terraform.tfvars\".\n\nTo silence these warnings, use TF_VAR_... environment variables."},"type":"diagnostic"}
{"@level":"error","@message":"Error: Error acquiring the state lock","@module":"terraform.ui","diagnostic":{"severity":"error","summary":"Error acquiring the state lock","detail":"Error message: HTTP remote state already locked: ID=6c1f0e2a-held\nLock Info:\n  ID:        d3912e86-own\n  Who:       root@vm\n"},"type":"diagnostic"}
a line on stderr
"#;

    fn read_plan(lines: &str) -> (String, PlanWarnings) {
        let mut text = Vec::new();
        let mut warnings = PlanWarnings::default();
        for l in lines.lines() {
            let v = view_line(l);
            text.extend(v.text);
            if let Some(d) = v.diagnostic {
                warnings.add(d);
            }
        }
        (text.join("\n"), warnings)
    }

    #[test]
    fn the_plan_view_reads_back_into_the_human_log_without_snippets() {
        let (text, warnings) = read_plan(PLAN_LINES);
        assert_eq!(
            text,
            "Terraform 1.11.4
terraform_data.x: Plan to create
Plan: 1 to add, 0 to change, 0 to destroy.

Warning: Check block assertion failed

  on main.tf line 10, in check \"health\":
  10:     condition     = var.v == \"b\"

v is not b

Warning: Value for undeclared variable

The root module does not declare a variable named \"old_setting\" but a value was found in file \"terraform.tfvars\".

To silence these warnings, use TF_VAR_... environment variables.

Error: Error acquiring the state lock

Error message: HTTP remote state already locked: ID=6c1f0e2a-held
Lock Info:
  ID:        d3912e86-own
  Who:       root@vm
a line on stderr"
        );
        assert!(
            !text.contains("snippet-value"),
            "a snippet's values are not shown"
        );
        // The state lock rule reads the rebuilt text as it read the human view's.
        assert_eq!(
            crate::core::state::HeldLock::from_engine_output(&text).map(|l| l.id),
            Some("6c1f0e2a-held".to_string())
        );
        // Warnings only; the error is the plan's failure.
        assert_eq!(warnings.given.len(), 2);
        // Not the view's JSON: kept as it came.
        assert_eq!(view_line("{not json").text, ["{not json"]);
    }

    #[test]
    fn plan_warnings_join_validates_once_each_and_a_failing_check_is_listed_once() {
        let provider = |module: &str| {
            format!(
                r#"{{"severity":"warning","summary":"Redundant empty provider block","detail":"module.{module}","range":{{"filename":"modules/{module}/main.tf","start":{{"line":1}}}}}}"#
            )
        };
        let doc = format!(
            r#"{{"valid":true,"diagnostics":[{},{}]}}"#,
            provider("one"),
            provider("two")
        );
        // The plan gives validation's warnings again, `one` twice (a module called twice).
        let plan_lines: String = [provider("one"), provider("one"), provider("two")]
            .iter()
            .map(|d| format!("{{\"type\":\"diagnostic\",\"diagnostic\":{d}}}\n"))
            .collect::<String>()
            + PLAN_LINES;
        let (_, plan) = read_plan(&plan_lines);
        // The `checks` as the plan's one parse kept them.
        let shown = crate::core::plan::Plan::from_json(br#"{"format_version":"1.2","resource_changes":[],"checks":[{"address":{"kind":"check","to_display":"check.health"},"status":"fail","instances":[{"address":{"to_display":"check.health"},"status":"fail","problems":[{"message":"v is not b"}]}]}]}"#).unwrap();
        let c = RootChecks::read(
            &ran(&doc, 0),
            &StepCheck::Off,
            &StepCheck::Off,
            &plan,
            Some(shown.checks_json()),
        );
        let summaries: Vec<(&str, usize)> = c
            .warnings
            .iter()
            .map(|g| (g.summary.as_str(), g.count))
            .collect();
        assert_eq!(
            summaries,
            [
                ("Redundant empty provider block", 3),
                ("Value for undeclared variable", 1)
            ]
        );
        assert_eq!(c.warnings[0].details[0].count, 2);
        assert_eq!(c.warnings[0].details[1].count, 1);
        assert_eq!(c.check_blocks.len(), 1);
        // Without the plan's `checks` (the plan failed), the plan's warning says it.
        let c = RootChecks::read(&ran(&doc, 0), &StepCheck::Off, &StepCheck::Off, &plan, None);
        assert!(c
            .warnings
            .iter()
            .any(|g| g.summary == "Check block assertion failed"));
        // Validation switched off: no warnings at all, the plan's neither.
        let c = RootChecks::read(
            &StepCheck::Off,
            &StepCheck::Off,
            &StepCheck::Off,
            &plan,
            Some(shown.checks_json()),
        );
        assert!(c.warnings.is_empty() && c.check_blocks.len() == 1);
    }

    #[test]
    fn a_plan_past_the_warnings_kept_counts_the_rest() {
        let mut plan = PlanWarnings::default();
        let w = |i: usize| Diagnostic {
            severity: Severity::Warning,
            summary: "Deprecated attribute".into(),
            detail: "use y".into(),
            at: Some(format!("main.tf:{i}")),
        };
        for i in 0..PLAN_WARNINGS_KEPT + 7 {
            plan.add(w(i));
        }
        // Already kept: counted again, not left out.
        plan.add(w(0));
        assert_eq!(plan.given.len(), PLAN_WARNINGS_KEPT);
        assert_eq!(plan.unread, 7);
        let c = RootChecks::read(
            &ran(r#"{"valid":true}"#, 0),
            &StepCheck::Off,
            &StepCheck::Off,
            &plan,
            None,
        );
        assert_eq!(c.warnings[0].count, PLAN_WARNINGS_KEPT + 1);
        assert_eq!(c.warnings_unread, 7);
        assert!(!c.is_quiet());
    }

    #[test]
    fn each_root_gets_its_share_of_one_fmt_over_every_roots_directory() {
        assert_eq!(
            fmt_check_args(&[]),
            ["fmt", "-check", "-list=true", "-recursive", "-no-color"]
        );
        assert_eq!(
            fmt_check_args(&["stacks/a", "."]),
            [
                "fmt",
                "-check",
                "-list=true",
                "-recursive",
                "-no-color",
                "--",
                "stacks/a",
                "."
            ]
        );
        // As `fmt` lists them from the checkout's top: nested roots list a file twice.
        let ran = StepCheck::Ran {
            exit: Some(3),
            stdout:
                b"stacks/a/main.tf\nstacks/a/sub/x.tf\nstacks/ab/y.tf\nstacks/a/main.tf\ntop.tf\n"
                    .to_vec(),
        };
        let share = |dir| match fmt_share(&ran, dir) {
            Some(StepCheck::Ran { exit, stdout }) => (exit, String::from_utf8(stdout).unwrap()),
            other => panic!("{other:?}"),
        };
        // Relative to the root, each once; `stacks/ab` is not under `stacks/a`.
        assert_eq!(
            share("stacks/a"),
            (Some(3), "main.tf\nsub/x.tf\n".to_string())
        );
        assert_eq!(share("stacks/ab"), (Some(3), "y.tf\n".to_string()));
        assert_eq!(share("stacks/c"), (Some(0), String::new()));
        assert_eq!(
            share("."),
            (
                Some(3),
                "stacks/a/main.tf\nstacks/a/sub/x.tf\nstacks/ab/y.tf\ntop.tf\n".to_string()
            )
        );
        // What a root reads of its share is what its own run would have given.
        let c = RootChecks::read(
            &StepCheck::Off,
            &fmt_share(&ran, "stacks/a").unwrap(),
            &StepCheck::Off,
            &PlanWarnings::default(),
            None,
        );
        assert_eq!(c.fmt.result().unwrap(), &["main.tf", "sub/x.tf"]);
        // A run that could not read every file, or did not run, is no one's share.
        let failed = StepCheck::Ran {
            exit: Some(2),
            stdout: Vec::new(),
        };
        assert_eq!(fmt_share(&failed, "stacks/a"), None);
        assert_eq!(fmt_share(&StepCheck::NotRun("x".into()), "."), None);
    }

    #[test]
    fn files_outside_the_roots_are_what_no_root_directory_holds() {
        let ran = StepCheck::Ran {
            exit: Some(3),
            stdout: b"stacks/a/main.tf\nmodules/vm/main.tf\nstacks/ab/planbot_state_override.tf\nmodules/vm/main.tf\nstacks/ab/x.tf\n".to_vec(),
        };
        // `stacks/ab` is no root here, `stacks/a` is.
        assert_eq!(
            fmt_outside(&ran, &["stacks/a"]),
            ["modules/vm/main.tf", "stacks/ab/x.tf"]
        );
        assert!(fmt_outside(&ran, &["."]).is_empty());
        let failed = StepCheck::Ran {
            exit: Some(2),
            stdout: b"modules/vm/main.tf\n".to_vec(),
        };
        assert!(fmt_outside(&failed, &["stacks/a"]).is_empty());
    }
}
