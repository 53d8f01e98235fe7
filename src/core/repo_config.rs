//! The repo configuration `.planbot.toml` (docs/configuration.md): roots, what triggers them, plan settings.
//!
//! Pure: parse + validate a text, decide which roots an MR's changed files affect, and render the
//! texts (`planbot check-repo-config` output, the MR note saying what is wrong) from `templates/`.
//!
//! ```toml
//! [[roots]]
//! name = "core"
//! dir = "tofu/stacks/core"
//! when_modified = ["*.tf", "*.tofu", "*.tfvars", "../../modules/**"]   # relative to dir
//! var_files = ["terraform.tfvars"]
//! workspace = "default"
//! lint_disable = ["PVE003"]          # lint rules off for this root only
//! parallelism = 1                     # `-parallelism=1` for its plan and apply (1..=256)
//! state = { gitlab = "core" }         # the project's GitLab-managed state `core`
//! checks = { fmt = false }            # engine checks off for this root (validate, fmt, test)
//! depends_on = ["network"]            # roots planned and applied before it (`core::root_graph`)
//!
//! [plan]
//! checkout = "merge"                 # or "head"
//! fork_mrs = "comment"               # or "never"
//!
//! [lint]
//! disable = ["PVE010"]               # lint rules off for every root
//!
//! [[policy_sets]]                    # Rego policies over every plan (`core::policy`)
//! name = "proxmox-guardrails"
//! path = "policies"                  # a directory of .rego files, from the repository top
//! owners = ["alice", "group:infra/admins"]   # who may approve a failure
//! roots = ["core"]                   # default: every root
//! namespace = "main"                 # the Rego package of the rules (default `main`)
//! ```
//!
//! Absent file: one root named `default` at `.`, planned when any file changes. Unknown keys are
//! errors, reported with their line and column.

use crate::core::engine_checks::CheckSet;
use crate::core::markdown::code_span;
use crate::core::policy::{self, PolicySetSpec};
use crate::core::root_graph::{GraphProblem, RootGraph};
use globset::{GlobBuilder, GlobSet, GlobSetBuilder};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::fmt;
use std::ops::Range;
use toml::Spanned;

/// Where the file lives in the repository.
pub const FILE_NAME: &str = ".planbot.toml";

/// The largest `.planbot.toml` planbot reads (1 MiB: a real one is a few KiB). A larger one is
/// refused from its size in git, unread ([`RepoConfigError::too_large`]).
pub const MAX_FILE_BYTES: u64 = 1024 * 1024;

/// The largest `parallelism` a root may set (the engine's own default is 10).
pub const MAX_PARALLELISM: u16 = 256;

/// `when_modified` when a root does not say: anything under its directory.
pub const DEFAULT_WHEN_MODIFIED: &[&str] = &["**"];

/// Which commit of an MR is planned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckoutMode {
    /// GitLab's merge result (`refs/merge-requests/IID/merge`): what would land.
    #[default]
    Merge,
    /// The MR's head commit.
    Head,
}

impl CheckoutMode {
    pub fn as_str(self) -> &'static str {
        match self {
            CheckoutMode::Merge => "merge",
            CheckoutMode::Head => "head",
        }
    }
}

/// What happens to MRs from forks (their code is untrusted and never planned automatically).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ForkMrs {
    /// Ignored entirely.
    Never,
    /// A note says a maintainer can comment `planbot plan` to run it.
    #[default]
    Comment,
}

impl ForkMrs {
    pub fn as_str(self) -> &'static str {
        match self {
            ForkMrs::Never => "never",
            ForkMrs::Comment => "comment",
        }
    }
}

/// Where a root's state lives, as `.planbot.toml` says (`roots[i].state`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum RootState {
    /// Not said: the service's `state.default` decides.
    #[default]
    Unset,
    /// `state = "own"`: whatever backend the root's own code configures.
    Own,
    /// `state = { gitlab = "NAME" }`: the project's GitLab-managed state `NAME` (the engine's
    /// `http` backend, set up by planbot).
    Gitlab(String),
}

/// One root module planbot plans.
#[derive(Debug, Clone)]
pub struct Root {
    pub name: String,
    /// Repo-relative, normalised, `.` for the top.
    pub dir: String,
    /// The patterns as written (relative to `dir`).
    pub when_modified: Vec<String>,
    /// The same, resolved to repo-relative patterns (dir `tofu/stacks/core` + `../../modules/**`
    /// → `tofu/modules/**`).
    pub patterns: Vec<String>,
    /// `-var-file` arguments, relative to `dir`.
    pub var_files: Vec<String>,
    pub workspace: String,
    /// Lint rules off for this root (its own `lint_disable` plus the file's `[lint] disable`).
    pub lint_disable: Vec<String>,
    /// Where its state lives.
    pub state: RootState,
    /// Whether the drift check covers it (`drift = false` on the root or the file opts out).
    pub drift: bool,
    /// `-parallelism=N` for its plans and applies (1..=[`MAX_PARALLELISM`]); `None`: the
    /// engine's default. Part of the plan's fingerprint.
    pub parallelism: Option<u16>,
    /// The engine's checks run beside its MR plans (`checks = { validate, fmt, test }`).
    pub checks: CheckSet,
    /// `depends_on`: the roots (by name) it reads from, planned and applied before it; checked
    /// (known names, no cycle) by [`RepoConfig::parse`], read through [`RepoConfig::graph`].
    pub depends_on: Vec<String>,
    matcher: GlobSet,
}

impl PartialEq for Root {
    fn eq(&self, other: &Root) -> bool {
        self.name == other.name
            && self.dir == other.dir
            && self.patterns == other.patterns
            && self.var_files == other.var_files
            && self.workspace == other.workspace
            && self.lint_disable == other.lint_disable
            && self.state == other.state
            && self.drift == other.drift
            && self.parallelism == other.parallelism
            && self.checks == other.checks
            && self.depends_on == other.depends_on
    }
}

impl Root {
    /// Does a change to this repo-relative path trigger the root?
    pub fn is_triggered_by(&self, path: &str) -> bool {
        self.matcher.is_match(path.trim_start_matches("./"))
    }

    /// The first pattern (repo-relative, of [`Root::patterns`]) that matches `path`.
    pub fn matching_pattern(&self, path: &str) -> Option<&str> {
        let first = self
            .matcher
            .matches(path.trim_start_matches("./"))
            .into_iter()
            .min()?;
        self.patterns.get(first).map(String::as_str)
    }

    /// Is lint rule `rule` switched off for this root?
    pub fn lint_disabled(&self, rule: &str) -> bool {
        self.lint_disable
            .iter()
            .any(|r| r.eq_ignore_ascii_case(rule))
    }
}

/// `[plan]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PlanSettings {
    pub checkout: CheckoutMode,
    pub fork_mrs: ForkMrs,
}

/// `[apply]`: what an apply of the default branch waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApplySettings {
    /// Approvals the merged MR needs from members (Developer or more) other than its author,
    /// each given after its last push; 0: none.
    pub approvals: u32,
    /// Whether GitLab's deploy freezes hold applies (Settings → CI/CD → Deploy freezes).
    pub deploy_freezes: bool,
}

impl ApplySettings {
    /// The stricter of `self` and `other`, setting by setting: the apply of a merge request
    /// holds to its merged `[apply]` and to the default branch's before the merge, so an MR
    /// may tighten them at once but never loosen them for its own apply.
    pub fn stricter(self, other: ApplySettings) -> ApplySettings {
        ApplySettings {
            approvals: self.approvals.max(other.approvals),
            deploy_freezes: self.deploy_freezes || other.deploy_freezes,
        }
    }
}

impl Default for ApplySettings {
    fn default() -> Self {
        ApplySettings {
            approvals: 0,
            deploy_freezes: true,
        }
    }
}

/// The most approvals `[apply] approvals` may ask for.
pub const MAX_APPROVALS: u32 = 20;

/// A valid repo configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct RepoConfig {
    pub roots: Vec<Root>,
    pub plan: PlanSettings,
    /// `[apply]`: approvals and deploy freezes.
    pub apply: ApplySettings,
    /// `[[policy_sets]]`: the Rego policy sets that check the plans (`core::policy`).
    pub policy_sets: Vec<PolicySetSpec>,
    /// True when there was no `.planbot.toml` (the one-root default).
    pub is_default: bool,
}

/// Whether one root is planned for a set of changed files, and why, in words.
#[derive(Debug, Clone, PartialEq)]
pub struct RootDecision<'a> {
    pub root: &'a Root,
    pub affected: bool,
    /// The changed files that triggered it (empty when skipped).
    pub matched: Vec<String>,
    /// "2 changed files match: `modules/vm/main.tf`, ..." or why it was skipped.
    pub reason: String,
}

/// One thing wrong with a `.planbot.toml`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConfigProblem {
    /// 1-based.
    pub line: Option<usize>,
    /// 1-based.
    pub column: Option<usize>,
    /// The key concerned, e.g. `when_modified` or `roots[1].dir`.
    pub key: Option<String>,
    pub message: String,
}

impl fmt::Display for ConfigProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.line, self.column) {
            (Some(l), Some(c)) => write!(f, "line {l}, column {c}: ")?,
            (Some(l), None) => write!(f, "line {l}: ")?,
            _ => {}
        }
        if let Some(k) = &self.key {
            write!(f, "key {}: ", code_span(k))?;
        }
        f.write_str(&self.message)
    }
}

/// Everything wrong with a `.planbot.toml` (all problems at once, in file order).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct RepoConfigError {
    pub problems: Vec<ConfigProblem>,
}

impl RepoConfigError {
    /// The file is `size` bytes, over the `max` planbot reads: one problem that says so.
    pub fn too_large(size: u64, max: u64) -> RepoConfigError {
        RepoConfigError {
            problems: vec![ConfigProblem {
                line: None,
                column: None,
                key: None,
                message: format!(
                    "the file is {}: planbot reads at most {} of it, and did not read this one",
                    byte_size(size),
                    byte_size(max)
                ),
            }],
        }
    }
}

/// `512 MiB`, `1.5 MiB`, `12 KiB`, `300 bytes`.
pub fn byte_size(bytes: u64) -> String {
    const KIB: u64 = 1024;
    const MIB: u64 = 1024 * KIB;
    if bytes >= MIB && bytes.is_multiple_of(MIB) {
        format!("{} MiB", bytes / MIB)
    } else if bytes >= MIB {
        format!("{:.1} MiB", bytes as f64 / MIB as f64)
    } else if bytes >= KIB {
        format!("{} KiB", bytes / KIB)
    } else {
        format!("{bytes} bytes")
    }
}

impl fmt::Display for RepoConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{FILE_NAME} is invalid: ")?;
        for (i, p) in self.problems.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

// ----- the file's shape (serde) ------------------------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    roots: Option<Spanned<Vec<RawRoot>>>,
    #[serde(default)]
    plan: Option<RawPlan>,
    #[serde(default)]
    apply: Option<RawApply>,
    #[serde(default)]
    lint: Option<RawLint>,
    #[serde(default)]
    policy_sets: Vec<RawPolicySet>,
    #[serde(default)]
    drift: Option<bool>,
    #[serde(default)]
    parallelism: Option<Spanned<toml::Value>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicySet {
    name: Spanned<String>,
    path: Spanned<String>,
    #[serde(default)]
    owners: Vec<Spanned<String>>,
    #[serde(default)]
    roots: Option<Spanned<Vec<Spanned<String>>>>,
    #[serde(default)]
    namespace: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoot {
    name: Spanned<String>,
    #[serde(default)]
    dir: Option<Spanned<String>>,
    #[serde(default)]
    when_modified: Option<Spanned<Vec<Spanned<String>>>>,
    #[serde(default)]
    var_files: Option<Vec<Spanned<String>>>,
    #[serde(default)]
    workspace: Option<Spanned<String>>,
    #[serde(default)]
    lint_disable: Option<Vec<Spanned<String>>>,
    #[serde(default)]
    state: Option<Spanned<toml::Value>>,
    #[serde(default)]
    drift: Option<bool>,
    #[serde(default)]
    parallelism: Option<Spanned<toml::Value>>,
    checks: Option<Spanned<toml::Value>>,
    #[serde(default)]
    depends_on: Option<Spanned<Vec<Spanned<String>>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPlan {
    #[serde(default)]
    checkout: Option<CheckoutMode>,
    #[serde(default)]
    fork_mrs: Option<ForkMrs>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawApply {
    #[serde(default)]
    approvals: Option<Spanned<toml::Value>>,
    #[serde(default)]
    deploy_freezes: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLint {
    #[serde(default)]
    disable: Vec<Spanned<String>>,
}

// ----- parsing and validation --------------------------------------------------------------------

/// 1-based line and column of a byte offset.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let col = before
        .rsplit('\n')
        .next()
        .map(|l| l.chars().count())
        .unwrap_or(0)
        + 1;
    (line, col)
}

struct Problems<'t> {
    text: &'t str,
    list: Vec<(usize, ConfigProblem)>,
    /// Problems past [`MAX_PROBLEMS`]: counted, neither located nor worded.
    more: usize,
}

/// At most this many problems of one file are listed (each is located by a scan of the text
/// and worded, some with every root's name); the rest are counted. A hostile file of a MiB
/// holds hundreds of thousands of `depends_on` entries.
pub const MAX_PROBLEMS: usize = 100;

/// At most this many roots in a repository: each is a plan of every merge request it reaches,
/// and the checks of `depends_on` (circles, what each root reaches) grow with their square.
pub const MAX_ROOTS: usize = 1000;

impl Problems<'_> {
    /// The configuration, or every problem in file order.
    fn finish(self, cfg: RepoConfig) -> Result<RepoConfig, RepoConfigError> {
        if self.list.is_empty() {
            return Ok(cfg);
        }
        let mut list = self.list;
        list.sort_by_key(|(offset, _)| *offset);
        let mut problems: Vec<ConfigProblem> = list.into_iter().map(|(_, p)| p).collect();
        if self.more > 0 {
            problems.push(ConfigProblem {
                line: None,
                column: None,
                key: None,
                message: format!(
                    "… and {} more problem{} (planbot lists the first {MAX_PROBLEMS})",
                    self.more,
                    if self.more == 1 { "" } else { "s" }
                ),
            });
        }
        Err(RepoConfigError { problems })
    }

    /// Whether no more problems are listed: a caller skips the work of wording one
    /// ([`Problems::at`] counts it).
    fn is_full(&self) -> bool {
        self.list.len() >= MAX_PROBLEMS
    }

    fn at(&mut self, span: Range<usize>, key: impl Into<String>, message: impl Into<String>) {
        if self.is_full() {
            self.more += 1;
            return;
        }
        let (line, column) = line_col(self.text, span.start);
        self.list.push((
            span.start,
            ConfigProblem {
                line: Some(line),
                column: Some(column),
                key: Some(key.into()),
                message: message.into(),
            },
        ));
    }
}

/// The key a toml/serde message is about (`unknown field `x``, `missing field `name``).
fn key_in_message(message: &str) -> Option<String> {
    for lead in [
        "unknown field `",
        "missing field `",
        "duplicate key `",
        "duplicate field `",
    ] {
        if let Some(rest) = message.split(lead).nth(1) {
            return rest.split('`').next().map(str::to_string);
        }
    }
    None
}

/// The table header a byte offset sits under (`[[roots]]` number n, `[plan]`, ...), for keys.
fn section_at(text: &str, offset: usize) -> Option<String> {
    let mut section = None;
    let mut root_index = 0usize;
    let mut set_index = 0usize;
    let mut pos = 0usize;
    for line in text.split_inclusive('\n') {
        if pos > offset {
            break;
        }
        let t = line.trim();
        if t.starts_with("[[") {
            let name = t
                .trim_start_matches("[[")
                .split("]]")
                .next()
                .unwrap_or("")
                .trim();
            if name == "roots" {
                root_index += 1;
                section = Some(format!("roots[{}]", root_index - 1));
            } else if name == "policy_sets" {
                set_index += 1;
                section = Some(format!("policy_sets[{}]", set_index - 1));
            } else {
                section = Some(name.to_string());
            }
        } else if t.starts_with('[') {
            let name = t
                .trim_start_matches('[')
                .split(']')
                .next()
                .unwrap_or("")
                .trim();
            section = Some(name.to_string());
        }
        pos += line.len();
    }
    section
}

/// The `key` of a `key = value` line holding a byte offset.
fn key_on_line(text: &str, offset: usize) -> Option<String> {
    let offset = offset.min(text.len());
    let start = text[..offset].rfind('\n').map(|i| i + 1).unwrap_or(0);
    let line = text[start..].lines().next()?;
    let (key, _) = line.split_once('=')?;
    let key = key.trim().trim_matches('"');
    (!key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
    .then(|| key.to_string())
}

fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// Why `s` cannot be in a disable list: not shaped like a rule id, or no rule planbot has (a
/// typo would silently keep the rule on), with the nearest real one.
fn rule_id_problem(s: &str) -> Option<String> {
    if !valid_rule_id(s) {
        return Some(format!("{} is not a rule id (like `PVE003`)", code_span(s)));
    }
    if crate::core::proxmox::findings::is_known_rule(s) {
        return None;
    }
    let ids = crate::core::proxmox::findings::RULES.iter().map(|r| r.id);
    Some(format!(
        "{} is not a rule planbot has{}",
        code_span(s),
        crate::core::suggest::did_you_mean(s, ids)
    ))
}

fn valid_rule_id(s: &str) -> bool {
    let letters = s.chars().take_while(|c| c.is_ascii_alphabetic()).count();
    letters > 0 && letters < s.len() && s[letters..].chars().all(|c| c.is_ascii_digit())
}

/// Join `rel` onto the repo-relative `base` dir and resolve `.`/`..` lexically. `Err` when the
/// result would leave the repository or `rel` is absolute.
pub fn normalize_path(base: &str, rel: &str) -> Result<String, String> {
    let drive = rel.len() > 1 && rel.as_bytes()[1] == b':';
    let shown = code_span(rel);
    if rel.chars().any(char::is_control) {
        return Err(format!(
            "{shown} holds a control character (a line break, a tab…); paths are one line"
        ));
    }
    if rel.starts_with('/') || rel.starts_with('\\') || drive {
        return Err(format!("{shown} is absolute; paths are relative"));
    }
    if rel.contains('\\') {
        return Err(format!("{shown} uses `\\`; use `/` as the separator"));
    }
    let mut parts: Vec<&str> = Vec::new();
    let base_parts = base.split('/').filter(|p| !p.is_empty() && *p != ".");
    for part in base_parts.chain(rel.split('/')) {
        match part {
            "" | "." => {}
            ".." => {
                if parts.pop().is_none() {
                    return Err(format!("{shown} leaves the repository"));
                }
            }
            p => parts.push(p),
        }
    }
    if parts.is_empty() {
        Ok(".".to_string())
    } else {
        Ok(parts.join("/"))
    }
}

fn build_matcher(patterns: &[String]) -> Result<GlobSet, String> {
    let mut b = GlobSetBuilder::new();
    for p in patterns {
        let glob = GlobBuilder::new(p)
            .literal_separator(true)
            .backslash_escape(true)
            .build()
            .map_err(|e| e.kind().to_string())?;
        b.add(glob);
    }
    b.build().map_err(|e| e.to_string())
}

impl RepoConfig {
    /// No `.planbot.toml`: one root `default` at `.`, triggered by any change.
    pub fn absent() -> RepoConfig {
        let patterns: Vec<String> = DEFAULT_WHEN_MODIFIED
            .iter()
            .map(|s| s.to_string())
            .collect();
        RepoConfig {
            roots: vec![Root {
                name: "default".into(),
                dir: ".".into(),
                when_modified: patterns.clone(),
                matcher: build_matcher(&patterns).expect("default globs are valid"),
                patterns,
                var_files: Vec::new(),
                workspace: "default".into(),
                lint_disable: Vec::new(),
                state: RootState::Unset,
                drift: true,
                parallelism: None,
                checks: CheckSet::ALL,
                depends_on: Vec::new(),
            }],
            plan: PlanSettings::default(),
            apply: ApplySettings::default(),
            policy_sets: Vec::new(),
            is_default: true,
        }
    }

    /// The configuration for a file's content, or [`RepoConfig::absent`] when there is none.
    pub fn from_optional(text: Option<&str>) -> Result<RepoConfig, RepoConfigError> {
        match text {
            Some(t) => RepoConfig::parse(t),
            None => Ok(RepoConfig::absent()),
        }
    }

    /// [`RepoConfig::from_optional`], with every root's `dir` checked against the branch's
    /// directories `dirs` ([`RepoConfig::parse_in`]).
    pub fn from_optional_in(
        text: Option<&str>,
        dirs: &BTreeSet<String>,
    ) -> Result<RepoConfig, RepoConfigError> {
        match text {
            Some(t) => RepoConfig::parse_in(t, dirs),
            None => Ok(RepoConfig::absent()),
        }
    }

    /// Parse and validate a `.planbot.toml`. All problems are reported together: the global
    /// settings first, then each root in turn ([`parse_root`]).
    pub fn parse(text: &str) -> Result<RepoConfig, RepoConfigError> {
        Self::parse_with(text, None)
    }

    /// [`RepoConfig::parse`] for the branch whose directories are `dirs` (repo-relative, every
    /// directory of the tree): a root whose `dir` is not one of them is a problem too, at its
    /// line, with the nearest directory that is (`did you mean`).
    pub fn parse_in(text: &str, dirs: &BTreeSet<String>) -> Result<RepoConfig, RepoConfigError> {
        Self::parse_with(text, Some(dirs))
    }

    fn parse_with(
        text: &str,
        tree: Option<&BTreeSet<String>>,
    ) -> Result<RepoConfig, RepoConfigError> {
        let mut problems = Problems {
            text,
            list: Vec::new(),
            more: 0,
        };
        let raw = match read_raw(text, &mut problems) {
            Some(raw) => raw,
            None => return problems.finish(RepoConfig::absent()),
        };
        let global_disable = global_lint_disable(raw.lint.as_ref(), &mut problems);
        let plan = plan_settings(raw.plan.as_ref());
        let apply = apply_settings(raw.apply.as_ref(), &mut problems);
        let file_parallelism = raw
            .parallelism
            .as_ref()
            .and_then(|p| parse_parallelism(p, "parallelism".into(), &mut problems));

        let raw_roots = match raw.roots {
            Some(r) => {
                if r.get_ref().is_empty() {
                    problems.at(
                        r.span(),
                        "roots",
                        "no roots defined; remove the key to plan the repository's top directory",
                    );
                }
                if r.get_ref().len() > MAX_ROOTS {
                    // Refused before any root is read: nothing of them is worth its cost.
                    problems.at(
                        r.span(),
                        "roots",
                        format!(
                            "{} roots: planbot plans at most {MAX_ROOTS} roots of a repository",
                            r.get_ref().len()
                        ),
                    );
                    return problems.finish(RepoConfig::absent());
                }
                r.into_inner()
            }
            None => {
                if problems.list.is_empty() {
                    let mut cfg = RepoConfig::absent();
                    cfg.is_default = false;
                    cfg.plan = plan;
                    cfg.apply = apply;
                    cfg.roots[0].lint_disable = global_disable;
                    cfg.roots[0].drift = raw.drift.unwrap_or(true);
                    cfg.roots[0].parallelism = file_parallelism;
                    cfg.policy_sets = parse_policy_sets(raw.policy_sets, &cfg.roots, &mut problems);
                    return problems.finish(cfg);
                }
                Vec::new()
            }
        };
        let mut roots = Vec::new();
        let mut dir_valid: Vec<bool> = Vec::new();
        // Each root's `depends_on` entries' spans (and the list's), for the graph's problems.
        let mut depends_spans: Vec<(Range<usize>, Vec<Range<usize>>)> = Vec::new();
        for (i, r) in raw_roots.into_iter().enumerate() {
            depends_spans.push(match &r.depends_on {
                Some(d) => (d.span(), d.get_ref().iter().map(|e| e.span()).collect()),
                None => (r.name.span(), Vec::new()),
            });
            let file_drift = raw.drift.unwrap_or(true);
            let dir_span = r.dir.as_ref().map(|d| d.span());
            let (mut root, dir_ok) =
                parse_root(i, r, &roots, &dir_valid, &global_disable, &mut problems);
            if let (true, Some(tree), Some(span)) = (dir_ok, tree, dir_span) {
                if let Some(message) = absent_dir(&root.dir, tree) {
                    problems.at(span, format!("roots[{i}].dir"), message);
                }
            }
            root.drift &= file_drift;
            root.parallelism = root.parallelism.or(file_parallelism);
            dir_valid.push(dir_ok);
            roots.push(root);
        }
        check_graph(&roots, &depends_spans, &mut problems);
        let policy_sets = parse_policy_sets(raw.policy_sets, &roots, &mut problems);
        problems.finish(RepoConfig {
            roots,
            plan,
            apply,
            policy_sets,
            is_default: false,
        })
    }

    /// Each root, and whether the changed files (repo-relative) affect it.
    pub fn roots_affected(&self, changed: &[String]) -> Vec<(&Root, bool)> {
        self.decide(changed)
            .into_iter()
            .map(|d| (d.root, d.affected))
            .collect()
    }

    /// Each root with the decision and its reason in words.
    pub fn decide(&self, changed: &[String]) -> Vec<RootDecision<'_>> {
        self.roots
            .iter()
            .map(|root| {
                let matched: Vec<String> = changed
                    .iter()
                    .filter(|f| root.is_triggered_by(f))
                    .cloned()
                    .collect();
                let reason = if matched.is_empty() {
                    format!(
                        "no changed file matches {}",
                        root.patterns
                            .iter()
                            .map(|p| code_span(p))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                } else {
                    let shown: Vec<String> = matched.iter().take(3).map(|f| code_span(f)).collect();
                    let more = if matched.len() > 3 {
                        format!(" and {} more", matched.len() - 3)
                    } else {
                        String::new()
                    };
                    let files = if matched.len() == 1 {
                        "file matches"
                    } else {
                        "files match"
                    };
                    format!(
                        "{} changed {files}: {}{more}",
                        matched.len(),
                        shown.join(", ")
                    )
                };
                RootDecision {
                    root,
                    affected: !matched.is_empty(),
                    matched,
                    reason,
                }
            })
            .collect()
    }

    /// A root by name.
    pub fn root(&self, name: &str) -> Option<&Root> {
        self.roots.iter().find(|r| r.name == name)
    }

    /// The roots' `depends_on` as a graph (order, layers, what is above and below a root). A
    /// configuration from [`RepoConfig::parse`] always has one; roots changed by hand into a
    /// circle or onto an unknown name since give the roots with no dependencies.
    pub fn graph(&self) -> RootGraph {
        let list: Vec<(&str, &[String])> = self
            .roots
            .iter()
            .map(|r| (r.name.as_str(), r.depends_on.as_slice()))
            .collect();
        RootGraph::new(&list).unwrap_or_else(|_| {
            RootGraph::independent(&self.roots.iter().map(|r| &r.name).collect::<Vec<_>>())
        })
    }
}

/// Why root directory `dir` is not in the branch whose directories are `tree`, with the
/// nearest one that is; `None` when it is there (the top always is).
fn absent_dir(dir: &str, tree: &BTreeSet<String>) -> Option<String> {
    if dir == "." || tree.contains(dir) {
        return None;
    }
    Some(
        match crate::core::suggest::nearest(dir, tree.iter().map(String::as_str)) {
            Some(near) => format!(
                "the directory {} does not exist on this branch (did you mean {}?)",
                code_span(dir),
                code_span(near)
            ),
            None => format!(
                "the directory {} does not exist on this branch",
                code_span(dir)
            ),
        },
    )
}

/// Every root's `depends_on` (`spans[i]`: the list's span and each entry's): unknown names
/// (with the nearest), a root on itself, a name twice, and each circle, at the entry's line.
fn check_graph(
    roots: &[Root],
    spans: &[(Range<usize>, Vec<Range<usize>>)],
    problems: &mut Problems<'_>,
) {
    let list: Vec<(&str, &[String])> = roots
        .iter()
        .map(|r| (r.name.as_str(), r.depends_on.as_slice()))
        .collect();
    let Err(found) = RootGraph::new(&list) else {
        return;
    };
    for p in found {
        if problems.is_full() {
            // Counted, not worded: an unknown name's message lists every root.
            problems.more += 1;
            continue;
        }
        let (i, e) = p.at();
        let span = spans[i]
            .1
            .get(e)
            .cloned()
            .unwrap_or_else(|| spans[i].0.clone());
        let message = match p {
            GraphProblem::Unknown {
                name, suggestion, ..
            } => {
                // No root name is longer than 64 characters: a longer entry is quoted cut.
                let name = match name.char_indices().nth(64) {
                    Some((at, _)) => format!("{}…", &name[..at]),
                    None => name,
                };
                match suggestion {
                Some(s) => format!(
                    "no root is named {} (did you mean {}?)",
                    code_span(&name),
                    code_span(&s)
                ),
                None => format!(
                    "no root is named {} (roots: {})",
                    code_span(&name),
                    roots
                        .iter()
                        .map(|r| code_span(&r.name))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                }
            }
            GraphProblem::OnItself { .. } => format!(
                "root {} cannot depend on itself",
                code_span(&roots[i].name)
            ),
            GraphProblem::Twice { .. } => format!(
                "{} is listed twice",
                code_span(&roots[i].depends_on[e])
            ),
            GraphProblem::Cycle { cycle, .. } => format!(
                "the roots depend on each other in a circle: {}; one of them must not depend on the next",
                cycle
                    .iter()
                    .map(|n| code_span(n))
                    .collect::<Vec<_>>()
                    .join(" → ")
            ),
        };
        problems.at(span, root_key(i, "depends_on"), message);
    }
}

/// The file's shape, every unknown key reported: serde stops at the first one, so each is
/// recorded in `problems` and blanked out (spaces, newlines kept: every later offset, line and
/// column stays right) before reading again, until the file reads or fails otherwise (that
/// problem recorded too, `None` returned). Bounded by the file's own keys.
fn read_raw(text: &str, problems: &mut Problems<'_>) -> Option<RawFile> {
    let mut current = text.to_string();
    for _ in 0..=text.matches('=').count() + text.matches('[').count() {
        let e = match toml::from_str::<RawFile>(&current) {
            Ok(raw) => return Some(raw),
            Err(e) => e,
        };
        let offset = e.span().map_or(0, |s| s.start);
        let mut found = syntax_error(&current, &e);
        problems
            .list
            .extend(found.problems.drain(..).map(|p| (offset, p)));
        let unknown = e.message().contains("unknown field");
        match e
            .span()
            .filter(|_| unknown)
            .and_then(|s| entry_span(&current, s.start))
        {
            Some(span) => {
                let blanked: String = current[span.clone()]
                    .chars()
                    .map(|c| if c == '\n' { c } else { ' ' })
                    .collect();
                current.replace_range(span, &blanked);
            }
            None => return None,
        }
    }
    None
}

/// The bytes of the `key = value` entry (or `[table]` with its entries) whose key starts at
/// `key_start`, as the TOML parser reads the file.
fn entry_span(text: &str, key_start: usize) -> Option<Range<usize>> {
    fn end_of(item: &toml_edit::Item) -> Option<usize> {
        match item {
            toml_edit::Item::Value(v) => v.span().map(|s| s.end),
            toml_edit::Item::Table(t) => t
                .iter()
                .filter_map(|(_, i)| end_of(i))
                .chain(t.span().map(|s| s.end))
                .max(),
            toml_edit::Item::ArrayOfTables(a) => a
                .iter()
                .flat_map(|t| {
                    t.iter()
                        .filter_map(|(_, i)| end_of(i))
                        .chain(t.span().map(|s| s.end))
                })
                .max(),
            toml_edit::Item::None => None,
        }
    }
    fn walk(table: &dyn toml_edit::TableLike, at: usize) -> Option<Range<usize>> {
        for (name, item) in table.iter() {
            if let Some(k) = table.key(name).and_then(|k| k.span()) {
                if k.start == at {
                    // A `[table]` header goes with its key: from its `[`.
                    let start = match item {
                        toml_edit::Item::Table(t) if !t.is_implicit() && !t.is_dotted() => {
                            t.span().map_or(k.start, |s| s.start.min(k.start))
                        }
                        _ => k.start,
                    };
                    return end_of(item).map(|end| start..end.max(k.end));
                }
            }
            let inner = match item {
                toml_edit::Item::ArrayOfTables(a) => a.iter().find_map(|t| walk(t, at)),
                other => other.as_table_like().and_then(|t| walk(t, at)),
            };
            if inner.is_some() {
                return inner;
            }
        }
        None
    }
    let doc = toml_edit::ImDocument::parse(text).ok()?;
    walk(doc.as_table(), key_start)
}

/// A file that is not valid TOML (or not of `.planbot.toml`'s shape): one problem, with the
/// line, column and dotted key when they can be found.
fn syntax_error(text: &str, e: &toml::de::Error) -> RepoConfigError {
    let (line, column) = match e.span() {
        Some(s) => {
            let (l, c) = line_col(text, s.start);
            (Some(l), Some(c))
        }
        None => (None, None),
    };
    let message = e.message().trim().to_string();
    let key = key_in_message(&message)
        .or_else(|| e.span().and_then(|s| key_on_line(text, s.start)))
        .map(|k| match e.span().and_then(|s| section_at(text, s.start)) {
            Some(section) if section != k => format!("{section}.{k}"),
            _ => k,
        });
    RepoConfigError {
        problems: vec![ConfigProblem {
            line,
            column,
            key,
            message: humanize(&message),
        }],
    }
}

/// `[lint] disable`: the rules every root leaves out (each must be a rule id).
fn global_lint_disable(lint: Option<&RawLint>, problems: &mut Problems<'_>) -> Vec<String> {
    let global_disable: Vec<String> = lint
        .map(|l| l.disable.iter().map(|r| r.get_ref().clone()).collect())
        .unwrap_or_default();
    if let Some(lint) = lint {
        for r in &lint.disable {
            if let Some(message) = rule_id_problem(r.get_ref()) {
                problems.at(r.span(), "lint.disable", message);
            }
        }
    }
    global_disable
}

/// `[plan]`, with the defaults for what it leaves out.
fn plan_settings(plan: Option<&RawPlan>) -> PlanSettings {
    PlanSettings {
        checkout: plan.and_then(|p| p.checkout).unwrap_or_default(),
        fork_mrs: plan.and_then(|p| p.fork_mrs).unwrap_or_default(),
    }
}

/// `[apply]`: `approvals` a whole number from 0 to [`MAX_APPROVALS`] (else a problem at its
/// line), `deploy_freezes` true unless said otherwise.
fn apply_settings(apply: Option<&RawApply>, problems: &mut Problems<'_>) -> ApplySettings {
    let mut settings = ApplySettings::default();
    let Some(apply) = apply else {
        return settings;
    };
    settings.deploy_freezes = apply.deploy_freezes.unwrap_or(true);
    if let Some(n) = &apply.approvals {
        match n.get_ref().as_integer() {
            Some(v) if (0..=i64::from(MAX_APPROVALS)).contains(&v) => settings.approvals = v as u32,
            _ => problems.at(
                n.span(),
                "apply.approvals",
                format!("expected a whole number from 0 to {MAX_APPROVALS} (the approvals an apply waits for), not {}", n.get_ref()),
            ),
        }
    }
    settings
}

/// How a problem names a key of the `i`th root: `roots[i].dir`.
fn root_key(i: usize, k: &str) -> String {
    format!("roots[{i}].{k}")
}

/// The `i`th `[[roots]]` entry, checked on its own and against the roots before it
/// (`dir_valid[j]`: whether root `j`'s `dir` was valid). Also says whether its own `dir` is.
fn parse_root(
    i: usize,
    r: RawRoot,
    earlier: &[Root],
    dir_valid: &[bool],
    global_disable: &[String],
    problems: &mut Problems<'_>,
) -> (Root, bool) {
    let name = root_name(i, &r, earlier, problems);
    let (dir, dir_ok) = root_dir(i, &r, problems);
    let workspace = root_workspace(i, &r, problems);
    let clash = earlier
        .iter()
        .zip(dir_valid)
        .find(|(x, ok): &(&Root, &bool)| **ok && dir_ok && x.dir == dir && x.workspace == workspace)
        .map(|(x, _)| x);
    if let Some(other) = clash {
        let span = r
            .dir
            .as_ref()
            .map(|d| d.span())
            .unwrap_or_else(|| r.name.span());
        problems.at(
            span,
            root_key(i, "dir"),
            format!(
                "root {} already plans {} in workspace {}",
                code_span(&other.name),
                code_span(&dir),
                code_span(&workspace)
            ),
        );
    }
    let (when_modified, patterns) = root_patterns(i, &r, &dir, problems);
    let var_files = root_var_files(i, &r, &dir, problems);
    let lint_disable = root_lint_disable(i, &r, global_disable, problems);
    let state = root_state(i, &r, &workspace, problems);
    let matcher = build_matcher(&patterns).unwrap_or_else(|_| GlobSet::empty());
    let drift = r.drift.unwrap_or(true);
    let parallelism = r
        .parallelism
        .as_ref()
        .and_then(|p| parse_parallelism(p, root_key(i, "parallelism"), problems));
    let checks = root_checks(i, &r, problems);
    let depends_on = r
        .depends_on
        .as_ref()
        .map(|d| {
            d.get_ref()
                .iter()
                .map(|e| e.get_ref().trim().to_string())
                .collect()
        })
        .unwrap_or_default();
    let root = Root {
        name,
        dir,
        when_modified,
        patterns,
        var_files,
        workspace,
        lint_disable,
        state,
        drift,
        parallelism,
        checks,
        depends_on,
        matcher,
    };
    (root, dir_ok)
}

/// `parallelism` (of the file: every root's default; of `roots[i]`: that root's): a whole
/// number from 1 to [`MAX_PARALLELISM`].
fn parse_parallelism(
    raw: &Spanned<toml::Value>,
    key: String,
    problems: &mut Problems<'_>,
) -> Option<u16> {
    match raw.get_ref() {
        toml::Value::Integer(n) if (1..=i64::from(MAX_PARALLELISM)).contains(n) => {
            u16::try_from(*n).ok()
        }
        other => {
            let written = match other {
                toml::Value::String(s) => format!("\"{s}\""),
                v => v.to_string(),
            };
            problems.at(
                raw.span(),
                key,
                format!(
                    "{} is not a parallelism: write a whole number from 1 to {MAX_PARALLELISM} (how many changes the engine makes at once; 1 = one at a time)",
                    code_span(&written)
                ),
            );
            None
        }
    }
}

/// `roots[i].checks`: a table of `validate`, `fmt`, `test`, each `true` or `false`; a key left
/// out stays on.
fn root_checks(i: usize, r: &RawRoot, problems: &mut Problems<'_>) -> CheckSet {
    let mut set = CheckSet::ALL;
    let Some(raw) = &r.checks else {
        return set;
    };
    let key = root_key(i, "checks");
    let form = "write `checks = { validate = false, fmt = false, test = false }` (each key optional, `true` by default)";
    let toml::Value::Table(t) = raw.get_ref() else {
        problems.at(raw.span(), key, form);
        return set;
    };
    for (name, value) in t {
        let slot = match name.as_str() {
            "validate" => &mut set.validate,
            "fmt" => &mut set.fmt,
            "test" => &mut set.test,
            _ => {
                problems.at(
                    raw.span(),
                    format!("{key}.{name}"),
                    format!(
                        "unknown check {}, expected one of {}{}",
                        code_span(name),
                        CheckSet::KEYS.map(code_span).join(", "),
                        crate::core::suggest::did_you_mean(name, CheckSet::KEYS)
                    ),
                );
                continue;
            }
        };
        match value {
            toml::Value::Boolean(b) => *slot = *b,
            _ => problems.at(
                raw.span(),
                format!("{key}.{name}"),
                format!("{} is `true` or `false`", code_span(name)),
            ),
        }
    }
    set
}

/// `roots[i].state`: `"own"` or `{ gitlab = "NAME" }` (a state name GitLab accepts in a URL:
/// no `/`, at most 255 characters). GitLab-managed state has no workspaces.
fn root_state(i: usize, r: &RawRoot, workspace: &str, problems: &mut Problems<'_>) -> RootState {
    let Some(raw) = &r.state else {
        return RootState::Unset;
    };
    const FORM: &str = "write `state = { gitlab = \"NAME\" }` (the project's GitLab-managed state NAME) or `state = \"own\"` (the backend the root's code configures)";
    let state = match raw.get_ref() {
        toml::Value::String(s) if s == "own" => RootState::Own,
        toml::Value::Table(t) if t.len() == 1 => {
            match t.get("gitlab") {
                Some(toml::Value::String(name))
                    if !name.trim().is_empty()
                        && name.len() <= 255
                        && !name.contains('/')
                        && !name.chars().any(char::is_control) =>
                {
                    RootState::Gitlab(name.trim().to_string())
                }
                Some(toml::Value::String(name)) => {
                    problems.at(
                    raw.span(),
                    root_key(i, "state"),
                    format!("`{name}` is not a state name GitLab accepts (1 to 255 characters, no `/`)"),
                );
                    return RootState::Unset;
                }
                _ => {
                    problems.at(raw.span(), root_key(i, "state"), FORM);
                    return RootState::Unset;
                }
            }
        }
        _ => {
            problems.at(raw.span(), root_key(i, "state"), FORM);
            return RootState::Unset;
        }
    };
    if matches!(state, RootState::Gitlab(_)) && workspace != "default" {
        problems.at(
            raw.span(),
            root_key(i, "state"),
            format!("GitLab-managed state has no workspaces: give workspace `{workspace}` its own state name and leave `workspace` out"),
        );
    }
    state
}

/// `roots[i].name`: valid and not used by an earlier root.
fn root_name(i: usize, r: &RawRoot, earlier: &[Root], problems: &mut Problems<'_>) -> String {
    let name = r.name.get_ref().trim().to_string();
    if !valid_name(&name) {
        problems.at(
            r.name.span(),
            root_key(i, "name"),
            format!(
                "{} is not a valid root name (letters, digits, `-`, `_`, `.`; at most 64)",
                code_span(r.name.get_ref())
            ),
        );
    } else if earlier.iter().any(|x: &Root| x.name == name) {
        problems.at(
            r.name.span(),
            root_key(i, "name"),
            format!(
                "root name {} is used twice; names must be unique",
                code_span(&name)
            ),
        );
    }
    name
}

/// `roots[i].dir`, normalised (default `.`), and whether it was valid.
fn root_dir(i: usize, r: &RawRoot, problems: &mut Problems<'_>) -> (String, bool) {
    match &r.dir {
        Some(d) => match normalize_path(".", d.get_ref()) {
            Ok(p) => (p, true),
            Err(e) => {
                problems.at(d.span(), root_key(i, "dir"), e);
                (".".into(), false)
            }
        },
        None => (".".into(), true),
    }
}

/// `roots[i].workspace` (default `default`).
fn root_workspace(i: usize, r: &RawRoot, problems: &mut Problems<'_>) -> String {
    match &r.workspace {
        Some(w) => {
            if !valid_name(w.get_ref()) {
                problems.at(
                    w.span(),
                    root_key(i, "workspace"),
                    format!("{} is not a valid workspace name", code_span(w.get_ref())),
                );
            }
            w.get_ref().clone()
        }
        None => "default".into(),
    }
}

/// `roots[i].when_modified` as written (default [`DEFAULT_WHEN_MODIFIED`]), and the valid
/// ones as globs relative to the repository.
fn root_patterns(
    i: usize,
    r: &RawRoot,
    dir: &str,
    problems: &mut Problems<'_>,
) -> (Vec<String>, Vec<String>) {
    let (when_modified, spans): (Vec<String>, Vec<Range<usize>>) = match &r.when_modified {
        Some(w) => {
            if w.get_ref().is_empty() {
                problems.at(
                    w.span(),
                    root_key(i, "when_modified"),
                    "empty list: the root would never be planned",
                );
            }
            w.get_ref()
                .iter()
                .map(|p| (p.get_ref().clone(), p.span()))
                .unzip()
        }
        None => (
            DEFAULT_WHEN_MODIFIED
                .iter()
                .map(|s| s.to_string())
                .collect(),
            DEFAULT_WHEN_MODIFIED
                .iter()
                .map(|_| r.name.span())
                .collect(),
        ),
    };
    let mut patterns = Vec::new();
    for (p, span) in when_modified.iter().zip(spans) {
        match normalize_path(dir, p) {
            Ok(n) => match build_matcher(std::slice::from_ref(&n)) {
                Ok(_) => patterns.push(n),
                Err(e) => problems.at(
                    span,
                    root_key(i, "when_modified"),
                    format!("{} is not a valid glob: {e}", code_span(p)),
                ),
            },
            Err(e) => problems.at(span, root_key(i, "when_modified"), e),
        }
    }
    (when_modified, patterns)
}

/// `roots[i].var_files` as written; each must stay inside the repository.
fn root_var_files(i: usize, r: &RawRoot, dir: &str, problems: &mut Problems<'_>) -> Vec<String> {
    let mut var_files = Vec::new();
    for v in r.var_files.iter().flatten() {
        if let Err(e) = normalize_path(dir, v.get_ref()) {
            problems.at(v.span(), root_key(i, "var_files"), e);
        }
        var_files.push(v.get_ref().clone());
    }
    var_files
}

/// `roots[i].lint_disable` added to the global `[lint] disable` (each must be a rule id).
fn root_lint_disable(
    i: usize,
    r: &RawRoot,
    global_disable: &[String],
    problems: &mut Problems<'_>,
) -> Vec<String> {
    let mut lint_disable = global_disable.to_vec();
    for l in r.lint_disable.iter().flatten() {
        if let Some(message) = rule_id_problem(l.get_ref()) {
            problems.at(l.span(), root_key(i, "lint_disable"), message);
        }
        if !lint_disable.contains(l.get_ref()) {
            lint_disable.push(l.get_ref().clone());
        }
    }
    lint_disable
}

/// `[[policy_sets]]`: each set checked on its own, against the sets before it (names are
/// unique) and against the roots (a set's `roots` must name roots of this file).
fn parse_policy_sets(
    raw: Vec<RawPolicySet>,
    roots: &[Root],
    problems: &mut Problems<'_>,
) -> Vec<PolicySetSpec> {
    let mut sets: Vec<PolicySetSpec> = Vec::new();
    for (i, s) in raw.into_iter().enumerate() {
        let key = |k: &str| format!("policy_sets[{i}].{k}");
        let name = s.name.get_ref().trim().to_string();
        if let Err(e) = policy::sets::check_name(&name) {
            problems.at(s.name.span(), key("name"), e);
        } else if sets.iter().any(|x| x.name == name) {
            problems.at(
                s.name.span(),
                key("name"),
                format!("policy set name `{name}` is used twice; names must be unique"),
            );
        }
        let path = match normalize_path(".", s.path.get_ref()) {
            Ok(p) => p,
            Err(e) => {
                problems.at(s.path.span(), key("path"), e);
                s.path.get_ref().clone()
            }
        };
        let mut owners = Vec::new();
        for o in &s.owners {
            match policy::Owner::parse(o.get_ref()) {
                Ok(owner) => owners.push(owner),
                Err(e) => problems.at(o.span(), key("owners"), e),
            }
        }
        let mut set_roots = Vec::new();
        if let Some(list) = &s.roots {
            if list.get_ref().is_empty() {
                problems.at(
                    list.span(),
                    key("roots"),
                    "empty list: the set would check nothing; remove the key to check every root",
                );
            }
            for r in list.get_ref() {
                if !roots.iter().any(|x| x.name == *r.get_ref()) {
                    let known: Vec<&str> = roots.iter().map(|x| x.name.as_str()).collect();
                    problems.at(
                        r.span(),
                        key("roots"),
                        format!(
                            "no root is named `{}` (roots: {})",
                            r.get_ref(),
                            known.join(", ")
                        ),
                    );
                }
                set_roots.push(r.get_ref().clone());
            }
        }
        let namespace = match &s.namespace {
            Some(n) => {
                if let Err(e) = policy::sets::check_namespace(n.get_ref()) {
                    problems.at(n.span(), key("namespace"), e);
                }
                n.get_ref().clone()
            }
            None => policy::DEFAULT_NAMESPACE.to_string(),
        };
        sets.push(PolicySetSpec {
            name,
            path,
            owners,
            roots: set_roots,
            namespace,
        });
    }
    sets
}

/// serde's wording, said the way an engineer would.
fn humanize(message: &str) -> String {
    let m = message
        .replace("unknown field", "unknown key")
        .replace("missing field", "missing key");
    m.replace("unknown variant", "unknown value")
}

// ----- texts -----------------------------------------------------------------------------------

#[derive(Serialize)]
struct RootView<'a> {
    name: &'a str,
    dir: &'a str,
    workspace: &'a str,
    when_modified: &'a [String],
    patterns: &'a [String],
    var_files: &'a [String],
    lint_disable: &'a [String],
    parallelism: Option<u16>,
    /// The engine's checks switched off (`validate`, `fmt`, `test`).
    checks_off: Vec<&'static str>,
    /// The GitLab-managed state's name, `own`, or nothing (the service decides).
    state: Option<&'a str>,
    depends_on: &'a [String],
}

fn roots_view(cfg: &RepoConfig) -> Vec<RootView<'_>> {
    cfg.roots
        .iter()
        .map(|r| RootView {
            name: &r.name,
            dir: &r.dir,
            workspace: &r.workspace,
            when_modified: &r.when_modified,
            patterns: &r.patterns,
            var_files: &r.var_files,
            lint_disable: &r.lint_disable,
            parallelism: r.parallelism,
            checks_off: CheckSet::KEYS
                .into_iter()
                .zip([r.checks.validate, r.checks.fmt, r.checks.test])
                .filter(|(_, on)| !on)
                .map(|(k, _)| k)
                .collect(),
            state: match &r.state {
                RootState::Unset => None,
                RootState::Own => Some("own"),
                RootState::Gitlab(name) => Some(name),
            },
            depends_on: &r.depends_on,
        })
        .collect()
}

fn render(name: &str, ctx: minijinja::Value) -> String {
    crate::core::templates::render(name, ctx)
        .unwrap_or_else(|e| format!("(template {name} failed: {e})\n"))
}

/// `planbot check-repo-config FILE` output for a valid file.
pub fn render_check_config(file: &str, cfg: &RepoConfig) -> String {
    render(
        "check_config.txt.j2",
        minijinja::context! {
            file => file,
            roots => roots_view(cfg),
            layers => cfg.graph().layers(),
            checkout => cfg.plan.checkout.as_str(),
            fork_mrs => cfg.plan.fork_mrs.as_str(),
            approvals => cfg.apply.approvals,
            deploy_freezes => cfg.apply.deploy_freezes,
            policy_sets => policy::sets::views(&cfg.policy_sets),
        },
    )
}

/// `planbot check-repo-config FILE` output for an invalid file.
pub fn render_check_config_error(file: &str, err: &RepoConfigError) -> String {
    render(
        "check_config_error.txt.j2",
        minijinja::context! {
            file => file,
            problems => err.problems.iter().map(|p| p.to_string()).collect::<Vec<_>>(),
        },
    )
}

/// The MR note text when the default branch's `.planbot.toml` is invalid (nothing is planned).
pub fn render_error_note(branch: &str, err: &RepoConfigError) -> String {
    render(
        "repo_config_error.md.j2",
        minijinja::context! {
            file => FILE_NAME,
            branch => branch,
            problems => err.problems.iter().map(|p| p.to_string()).collect::<Vec<_>>(),
        },
    )
}

/// The MR note section previewing a `.planbot.toml` the MR changes (valid or not).
pub fn render_preview(result: &Result<RepoConfig, RepoConfigError>, branch: &str) -> String {
    match result {
        Ok(cfg) => render(
            "repo_config_preview.md.j2",
            minijinja::context! {
                file => FILE_NAME,
                branch => branch,
                valid => true,
                roots => roots_view(cfg),
                checkout => cfg.plan.checkout.as_str(),
                fork_mrs => cfg.plan.fork_mrs.as_str(),
            },
        ),
        Err(err) => render(
            "repo_config_preview.md.j2",
            minijinja::context! {
                file => FILE_NAME,
                branch => branch,
                valid => false,
                problems => err.problems.iter().map(|p| p.to_string()).collect::<Vec<_>>(),
            },
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = r#"[[roots]]
name = "core"
dir = "tofu/stacks/core"
when_modified = ["*.tf", "*.tofu", "*.tfvars", "../../modules/**"]
var_files = ["terraform.tfvars"]
workspace = "default"

[[roots]]
name = "dns"
dir = "tofu/stacks/dns/"
lint_disable = ["PVE003"]

[plan]
checkout = "merge"
fork_mrs = "comment"

[lint]
disable = ["PVE010"]
"#;

    fn files(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_design_example_parses_with_paths_resolved_from_the_root_dir() {
        let cfg = RepoConfig::parse(EXAMPLE).unwrap();
        assert_eq!(cfg.roots.len(), 2);
        let core = &cfg.roots[0];
        assert_eq!(core.dir, "tofu/stacks/core");
        assert_eq!(
            core.patterns,
            [
                "tofu/stacks/core/*.tf",
                "tofu/stacks/core/*.tofu",
                "tofu/stacks/core/*.tfvars",
                "tofu/modules/**"
            ]
        );
        assert_eq!(core.var_files, ["terraform.tfvars"]);
        assert_eq!(core.lint_disable, ["PVE010"]);
        let dns = &cfg.roots[1];
        assert_eq!(dns.dir, "tofu/stacks/dns");
        assert_eq!(dns.patterns, ["tofu/stacks/dns/**"]);
        assert_eq!(dns.lint_disable, ["PVE010", "PVE003"]);
        assert!(dns.lint_disabled("pve003"));
        assert!(!core.lint_disabled("PVE003"));
        assert_eq!(cfg.plan.checkout, CheckoutMode::Merge);
        assert_eq!(cfg.plan.fork_mrs, ForkMrs::Comment);
    }

    #[test]
    fn drift_is_checked_unless_the_root_or_the_file_opts_out() {
        let two = |file: &str, root: &str| {
            RepoConfig::parse(&format!(
                "{file}\n[[roots]]\nname = \"core\"\ndir = \"core\"\n{root}\n[[roots]]\nname = \"dns\"\ndir = \"dns\"\n"
            ))
            .unwrap()
            .roots
            .iter()
            .map(|r| r.drift)
            .collect::<Vec<_>>()
        };
        assert_eq!(two("", ""), [true, true]);
        assert_eq!(two("", "drift = false"), [false, true]);
        assert_eq!(two("drift = false", ""), [false, false]);
        assert!(RepoConfig::absent().roots[0].drift);
        assert!(!RepoConfig::parse("drift = false").unwrap().roots[0].drift);
        assert!(RepoConfig::parse("drift = \"no\"").is_err());
    }

    #[test]
    fn parallelism_is_a_whole_number_from_1_to_256() {
        let root = |line: &str| {
            RepoConfig::parse(&format!("[[roots]]\nname = \"core\"\n{line}\n"))
                .map(|c| c.roots[0].parallelism)
        };
        assert_eq!(root("").unwrap(), None);
        assert_eq!(root("parallelism = 1").unwrap(), Some(1));
        assert_eq!(root("parallelism = 256").unwrap(), Some(256));
        // The file's value is every root's default; a root's own wins.
        let cfg = RepoConfig::parse(
            "parallelism = 2\n[[roots]]\nname = \"a\"\ndir = \"a\"\n[[roots]]\nname = \"b\"\ndir = \"b\"\nparallelism = 1\n",
        )
        .unwrap();
        let got: Vec<_> = cfg.roots.iter().map(|r| r.parallelism).collect();
        assert_eq!(got, [Some(2), Some(1)]);
        let shown = render_check_config(".planbot.toml", &cfg);
        assert!(
            shown.contains("parallelism    1 (`-parallelism=1` for its plan and apply)"),
            "{shown}"
        );
        assert_eq!(
            RepoConfig::parse("parallelism = 3").unwrap().roots[0].parallelism,
            Some(3)
        );
        assert!(RepoConfig::parse("parallelism = 300").is_err());
        for bad in [
            "parallelism = 0",
            "parallelism = 257",
            "parallelism = -1",
            "parallelism = \"2\"",
            "parallelism = 1.5",
        ] {
            let err = root(bad).unwrap_err();
            let text = render_check_config_error(".planbot.toml", &err);
            assert!(text.contains("roots[0].parallelism"), "{bad}: {text}");
            assert!(
                text.contains("a whole number from 1 to 256"),
                "{bad}: {text}"
            );
        }
    }

    #[test]
    fn changed_files_pick_the_roots_they_touch() {
        let cfg = RepoConfig::parse(EXAMPLE).unwrap();
        let d = cfg.decide(&files(&["tofu/modules/vm/disks/main.tf"]));
        assert!(d[0].affected, "a module change re-plans core");
        assert_eq!(
            d[0].reason,
            "1 changed file matches: `tofu/modules/vm/disks/main.tf`"
        );
        assert!(!d[1].affected);
        assert_eq!(d[1].reason, "no changed file matches `tofu/stacks/dns/**`");

        // `*.tf` is relative to the dir and does not cross directories.
        let d = cfg.roots_affected(&files(&["tofu/stacks/core/sub/x.tf", "README.md"]));
        assert!(!d[0].1);
        let d = cfg.roots_affected(&files(&[
            "tofu/stacks/core/main.tf",
            "tofu/stacks/dns/a/b.yaml",
        ]));
        assert!(d[0].1 && d[1].1);
        let many = files(&[
            "tofu/modules/a",
            "tofu/modules/b",
            "tofu/modules/c",
            "tofu/modules/d",
            "tofu/modules/e",
        ]);
        assert_eq!(
            cfg.decide(&many)[0].reason,
            "5 changed files match: `tofu/modules/a`, `tofu/modules/b`, `tofu/modules/c` and 2 more"
        );
    }

    #[test]
    fn no_file_means_one_root_at_the_top_planned_on_any_change() {
        let cfg = RepoConfig::from_optional(None).unwrap();
        assert!(cfg.is_default);
        assert_eq!(cfg.roots.len(), 1);
        assert_eq!(cfg.roots[0].name, "default");
        assert_eq!(cfg.roots[0].dir, ".");
        assert!(cfg.roots_affected(&files(&["a/b/c.tf"]))[0].1);
        assert!(!cfg.roots_affected(&[])[0].1);
        // A file with only [plan] keeps the default root but its settings.
        let cfg = RepoConfig::parse("[plan]\ncheckout = \"head\"\n").unwrap();
        assert_eq!(cfg.roots[0].name, "default");
        assert_eq!(cfg.plan.checkout, CheckoutMode::Head);
        assert!(!cfg.is_default);
    }

    #[test]
    fn every_problem_is_reported_at_once_unknown_keys_included() {
        let text = "[lint]\ndisable = [\"PVE999\"]\n\n[[roots]]\nname = \"core\"\nwhen_modifed = [\n  \"core/**\",\n]\n\n[[roots]]\nname = \"core\"\nlint_disable = [\"PVE998\"]\n\n[lints]\ndisable = []\n\n[plan]\nforks = \"never\"\n";
        let err = RepoConfig::parse(text).unwrap_err();
        let found: Vec<(Option<usize>, Option<&str>)> = err
            .problems
            .iter()
            .map(|p| (p.line, p.key.as_deref()))
            .collect();
        assert_eq!(
            found,
            vec![
                (Some(2), Some("lint.disable")),
                (Some(6), Some("roots[0].when_modifed")),
                (Some(11), Some("roots[1].name")),
                (Some(11), Some("roots[1].dir")),
                (Some(12), Some("roots[1].lint_disable")),
                (Some(14), Some("lints")),
                (Some(18), Some("plan.forks")),
            ],
            "{err}"
        );
        assert!(
            err.problems[1]
                .message
                .starts_with("unknown key `when_modifed`"),
            "{err}"
        );
    }

    #[test]
    fn unknown_keys_are_rejected_with_their_line_and_name() {
        let text = "[[roots]]\nname = \"core\"\ndirectory = \"x\"\n";
        let err = RepoConfig::parse(text).unwrap_err();
        let p = &err.problems[0];
        assert_eq!(p.line, Some(3));
        assert_eq!(p.key.as_deref(), Some("roots[0].directory"));
        assert!(
            p.message.starts_with("unknown key `directory`"),
            "{}",
            p.message
        );

        let err =
            RepoConfig::parse("[plan]\ncheckout = \"merge\"\nforks = \"never\"\n").unwrap_err();
        assert_eq!(err.problems[0].line, Some(3));
        assert_eq!(err.problems[0].key.as_deref(), Some("plan.forks"));

        let err = RepoConfig::parse("[plan]\ncheckout = \"rebase\"\n").unwrap_err();
        assert_eq!(err.problems[0].line, Some(2));
        assert_eq!(err.problems[0].key.as_deref(), Some("plan.checkout"));
        assert!(
            err.problems[0].message.contains("unknown value `rebase`"),
            "{}",
            err.problems[0].message
        );

        let err = RepoConfig::parse("[[roots]]\ndir = \"x\"\n").unwrap_err();
        assert!(
            err.problems[0].message.contains("missing key `name`"),
            "{err}"
        );

        let err = RepoConfig::parse("[[roots]\nname = 1\n").unwrap_err();
        assert_eq!(err.problems[0].line, Some(1));
    }

    #[test]
    fn validation_reports_every_problem_with_its_line() {
        let text = r#"[[roots]]
name = "core"
dir = "../outside"

[[roots]]
name = "core"
dir = "/abs"
when_modified = ["[", "../../../../x/**"]
var_files = ["../../../../secrets.tfvars"]
lint_disable = ["not a rule"]
"#;
        let err = RepoConfig::parse(text).unwrap_err();
        let shown: Vec<String> = err.problems.iter().map(|p| p.to_string()).collect();
        assert_eq!(
            shown,
            [
                "line 3, column 7: key `roots[0].dir`: `../outside` leaves the repository",
                "line 6, column 8: key `roots[1].name`: root name `core` is used twice; names must be unique",
                "line 7, column 7: key `roots[1].dir`: `/abs` is absolute; paths are relative",
                "line 8, column 18: key `roots[1].when_modified`: `[` is not a valid glob: unclosed character class; missing ']'",
                "line 8, column 23: key `roots[1].when_modified`: `../../../../x/**` leaves the repository",
                "line 9, column 14: key `roots[1].var_files`: `../../../../secrets.tfvars` leaves the repository",
                "line 10, column 17: key `roots[1].lint_disable`: `not a rule` is not a rule id (like `PVE003`)",
            ]
        );
    }

    #[test]
    fn depends_on_names_roots_of_the_file_without_a_circle() {
        let cfg = RepoConfig::parse(
            "[[roots]]\nname = \"dns\"\ndir = \"dns\"\ndepends_on = [\"vms\"]\n[[roots]]\nname = \"network\"\ndir = \"network\"\n[[roots]]\nname = \"vms\"\ndir = \"vms\"\ndepends_on = [\"network\"]\n",
        )
        .unwrap();
        assert_eq!(cfg.roots[0].depends_on, ["vms"]);
        assert!(cfg.roots[1].depends_on.is_empty());
        assert_eq!(cfg.graph().order(), ["network", "vms", "dns"]);
        assert_eq!(cfg.graph().upstream_of("dns"), ["network", "vms"]);
        assert!(RepoConfig::absent()
            .graph()
            .upstream_of("default")
            .is_empty());

        let text = "[[roots]]\nname = \"network\"\ndir = \"n\"\ndepends_on = [\"vms\"]\n\n[[roots]]\nname = \"vms\"\ndir = \"v\"\ndepends_on = [\n  \"netwrok\",\n  \"vms\",\n  \"network\",\n]\n";
        let err = RepoConfig::parse(text).unwrap_err();
        let shown: Vec<String> = err.problems.iter().map(|p| p.to_string()).collect();
        assert_eq!(
            shown,
            [
                "line 4, column 15: key `roots[0].depends_on`: the roots depend on each other in a circle: `network` → `vms` → `network`; one of them must not depend on the next",
                "line 10, column 3: key `roots[1].depends_on`: no root is named `netwrok` (did you mean `network`?)",
                "line 11, column 3: key `roots[1].depends_on`: root `vms` cannot depend on itself",
            ]
        );
        let err =
            RepoConfig::parse("[[roots]]\nname = \"a\"\ndepends_on = [\"zzz\"]\n").unwrap_err();
        assert_eq!(
            err.problems[0].message,
            "no root is named `zzz` (roots: `a`)"
        );
    }

    #[test]
    fn two_roots_on_the_same_dir_and_workspace_clash() {
        let text = "[[roots]]\nname = \"a\"\ndir = \"x\"\n[[roots]]\nname = \"b\"\ndir = \"x/\"\n[[roots]]\nname = \"c\"\ndir = \"x\"\nworkspace = \"staging\"\n";
        let err = RepoConfig::parse(text).unwrap_err();
        assert_eq!(err.problems.len(), 1, "{err}");
        assert_eq!(
            err.problems[0].to_string(),
            "line 6, column 7: key `roots[1].dir`: root `a` already plans `x` in workspace `default`"
        );
    }

    #[test]
    fn paths_normalise_lexically_and_cannot_escape() {
        assert_eq!(normalize_path("a/b", "../../m/**").unwrap(), "m/**");
        assert_eq!(normalize_path(".", "./x/./y/").unwrap(), "x/y");
        assert_eq!(normalize_path(".", "").unwrap(), ".");
        assert!(normalize_path("a", "../../x").is_err());
        assert!(normalize_path(".", "/etc").is_err());
        assert!(normalize_path(".", "a\\b").is_err());
    }

    #[test]
    fn checks_are_on_unless_a_root_switches_one_off_and_a_typo_is_named() {
        let cfg = RepoConfig::parse(
            "[[roots]]\nname = \"core\"\nchecks = { fmt = false }\n\n[[roots]]\nname = \"dns\"\ndir = \"dns\"\n",
        )
        .unwrap();
        assert_eq!(
            cfg.roots[0].checks,
            CheckSet {
                validate: true,
                fmt: false,
                test: true
            }
        );
        assert_eq!(cfg.roots[1].checks, CheckSet::ALL);
        assert_eq!(RepoConfig::absent().roots[0].checks, CheckSet::ALL);

        let err = RepoConfig::parse(
            "[[roots]]\nname = \"core\"\nchecks = { tset = false, fmt = \"no\" }\n",
        )
        .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("line 3, column 10: key `roots[0].checks.tset`: unknown check `tset`, expected one of `validate`, `fmt`, `test` (did you mean `test`?)"),
            "{text}"
        );
        assert!(
            text.contains("key `roots[0].checks.fmt`: `fmt` is `true` or `false`"),
            "{text}"
        );
        let err = RepoConfig::parse("[[roots]]\nname = \"core\"\nchecks = false\n").unwrap_err();
        assert!(
            err.to_string()
                .contains("`roots[0].checks`: write `checks = {"),
            "{err}"
        );
    }

    /// A proposed `.planbot.toml` is hostile input: its checks cost what its size costs, not
    /// its square. Thousands of roots in a chain made the circle check hold every root each
    /// reaches (17,000 roots fit in a MiB: 145 million entries), and every unknown `depends_on`
    /// name was compared with every root's name, located by a scan of the whole text and worded
    /// with every root's name.
    #[test]
    fn a_hostile_config_is_refused_at_the_cost_of_its_size() {
        let mut chain = String::new();
        for i in 0..5000 {
            chain.push_str(&format!("[[roots]]\nname = \"r{i}\"\ndir = \"d{i}\"\n"));
            if i > 0 {
                chain.push_str(&format!("depends_on = [\"r{}\"]\n", i - 1));
            }
        }
        let err = RepoConfig::parse(&chain).unwrap_err();
        assert_eq!(err.problems.len(), 1, "{err}");
        assert!(
            err.to_string()
                .contains("5000 roots: planbot plans at most 1000 roots of a repository"),
            "{err}"
        );

        // 300 roots, each naming ten roots that do not exist.
        let mut unknown = String::new();
        for i in 0..300 {
            let deps: Vec<String> = (0..10).map(|k| format!("\"x{i}-{k}\"")).collect();
            unknown.push_str(&format!(
                "[[roots]]\nname = \"r{i}\"\ndir = \"d{i}\"\ndepends_on = [{}]\n",
                deps.join(", ")
            ));
        }
        let err = RepoConfig::parse(&unknown).unwrap_err();
        assert_eq!(err.problems.len(), MAX_PROBLEMS + 1, "{err}");
        assert_eq!(
            err.problems.last().unwrap().message,
            format!("… and 2900 more problems (planbot lists the first {MAX_PROBLEMS})")
        );
        // The listed ones are the first, each still with its place and words.
        assert_eq!(err.problems[0].line, Some(4));
        assert!(
            err.problems[0]
                .message
                .starts_with("no root is named `x0-0`"),
            "{err}"
        );

        // A name a MiB long is never compared with the roots' names (a root name has at most
        // 64 characters): no suggestion, and the same answer as a short stranger.
        let long = format!(
            "[[roots]]\nname = \"a\"\ndir = \"a\"\ndepends_on = [\"{}\"]\n[[roots]]\nname = \"b\"\ndir = \"b\"\n",
            "b".repeat(1 << 20)
        );
        let err = RepoConfig::parse(&long).unwrap_err();
        assert_eq!(err.problems.len(), 1);
        assert!(
            err.problems[0].message.ends_with("(roots: `a`, `b`)"),
            "{}",
            &err.problems[0].message[err.problems[0].message.len() - 40..]
        );
        // And it is quoted cut, not a MiB into the note.
        assert_eq!(
            err.problems[0].message,
            format!("no root is named `{}…` (roots: `a`, `b`)", "b".repeat(64))
        );
    }
}
