//! Policy checks: Rego policy sets evaluated over a plan the way conftest does, in-process.
//! The sets' table (`[[policy_sets]]`), the evaluator, `data.planbot`, and conftest's output.
//!
//! The one entry point is [`evaluate`]: a pure function from the plan's `show -json` document,
//! planbot's findings on it and the policy sets (their files already read) to a [`Verdict`]
//! (per set: passed, its failures and warnings, or the error that stopped it). A set that could
//! not be evaluated is never a pass: [`Verdict::blocks`] counts it with the failures.

mod data;
mod output;
mod reads;
mod rego;
pub mod review;
pub mod sets;

pub use data::{planbot_data, planbot_data_with};
pub use output::{conftest_json, conftest_text, render_errors};
pub use reads::InputReads;
pub use rego::PlanDocument;
pub use sets::{Owner, PolicySetSpec, DEFAULT_NAMESPACE};

use crate::core::proxmox::findings::Finding;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// How long one set may evaluate by default (every rule of its namespace, together).
pub const DEFAULT_LIMIT: Duration = Duration::from_secs(10);

/// One `.rego` file of a set: its path as shown to users (relative to the set's directory) and
/// its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyFile {
    pub path: String,
    pub text: String,
}

/// A policy set ready to evaluate: its files, the package its rules are read from, and its
/// evaluation limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicySet {
    pub name: String,
    /// The Rego package whose `deny`/`violation`/`warn` rules count (`main` by default).
    pub namespace: String,
    pub files: Vec<PolicyFile>,
    /// The wall-clock budget of the whole set.
    pub limit: Duration,
}

/// What the policies see: `input` (the plan document as the engine wrote it) and the findings
/// and root that make `data.planbot`.
#[derive(Debug, Clone, Copy)]
pub struct PlanInput<'a> {
    /// The `show -json` document, exactly.
    pub plan_json: &'a str,
    /// planbot's lint (and, on the service, preflight) findings on this plan.
    pub findings: &'a [Finding],
    /// The root's name (`data.planbot.root`).
    pub root: &'a str,
}

/// One message of a rule: conftest's `{"msg": ..., "metadata": {...}}` (the metadata is every
/// other key of an object result, without conftest's reserved `_loc`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub msg: String,
    #[serde(skip_serializing_if = "serde_json::Map::is_empty")]
    pub metadata: serde_json::Map<String, serde_json::Value>,
}

impl Message {
    pub fn new(msg: impl Into<String>) -> Message {
        Message {
            msg: msg.into(),
            metadata: serde_json::Map::new(),
        }
    }
}

/// What a set's rules said, counted as conftest counts them: one success per rule definition
/// that produced nothing, one failure or warning per message, one exception per rule an
/// `exception` switched off.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Results {
    pub successes: usize,
    pub failures: Vec<Message>,
    pub warnings: Vec<Message>,
    pub exceptions: Vec<Message>,
}

impl Results {
    /// conftest's "tests": every definition and message counted once.
    pub fn tests(&self) -> usize {
        self.successes + self.failures.len() + self.warnings.len() + self.exceptions.len()
    }
}

/// Why a set could not be evaluated. Each says what to fix; none is ever taken for a pass.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum PolicyError {
    /// The input is not a JSON document.
    #[error("the plan is not JSON: {0}")]
    Input(String),
    /// The set's directory holds no `.rego` file.
    #[error("no .rego file in the policy directory")]
    NoFiles,
    /// A file is neither Rego v1 nor the older syntax.
    #[error("{file} does not parse: {message}")]
    Parse { file: String, message: String },
    /// No `deny`/`violation`/`warn` rule in the namespace: a typo here would otherwise pass.
    #[error("no deny, violation or warn rule in package `{namespace}` (packages found: {found}); set the namespace to the package of your rules")]
    NoRules { namespace: String, found: String },
    /// Evaluating a rule failed (a builtin error, a conflict, an unsupported builtin).
    #[error("evaluating `{rule}` failed: {message}")]
    Eval { rule: String, message: String },
    /// A rule's value is not messages (a string, or an object with a string `msg`).
    #[error("`{rule}` produced {found}; a rule must produce messages: a string, or an object with a string \"msg\" (write `{rule} contains msg if {{ ... }}`)")]
    BadResult { rule: String, found: String },
    /// The set ran past its limit.
    #[error("evaluation stopped after {limit:?}, the limit of a policy set (a policy that loops over too much?)")]
    Limit { limit: Duration },
    /// The set's directory could not be read (missing, a symbolic link, a file too large).
    #[error("{0}")]
    Unreadable(String),
}

/// What became of one set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Outcome {
    Checked(Results),
    Error(PolicyError),
}

/// One set's verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SetVerdict {
    pub name: String,
    pub namespace: String,
    pub outcome: Outcome,
}

impl SetVerdict {
    /// Evaluated, and no failure.
    pub fn passed(&self) -> bool {
        matches!(&self.outcome, Outcome::Checked(r) if r.failures.is_empty())
    }

    /// The results when the set could be evaluated.
    pub fn results(&self) -> Option<&Results> {
        match &self.outcome {
            Outcome::Checked(r) => Some(r),
            Outcome::Error(_) => None,
        }
    }

    /// The error that stopped it.
    pub fn error(&self) -> Option<&PolicyError> {
        match &self.outcome {
            Outcome::Checked(_) => None,
            Outcome::Error(e) => Some(e),
        }
    }
}

/// Every set's verdict, in the order the sets were given.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Verdict {
    pub sets: Vec<SetVerdict>,
}

impl Verdict {
    /// The sets that passed (warnings allowed).
    pub fn passed_sets(&self) -> impl Iterator<Item = &SetVerdict> {
        self.sets.iter().filter(|s| s.passed())
    }

    /// The sets that block: a failure, or an error (a set that could not run is not a pass).
    pub fn blocking_sets(&self) -> impl Iterator<Item = &SetVerdict> {
        self.sets.iter().filter(|s| !s.passed())
    }

    /// Whether any set blocks.
    pub fn blocks(&self) -> bool {
        self.blocking_sets().next().is_some()
    }

    /// Whether any set could not be evaluated.
    pub fn has_errors(&self) -> bool {
        self.sets.iter().any(|s| s.error().is_some())
    }
}

/// Evaluate every set over one plan. The plan document is read once; each set runs in its own
/// interpreter, within its limit.
pub fn evaluate(input: &PlanInput<'_>, sets: &[PolicySet]) -> Verdict {
    match PlanDocument::read_for(input.plan_json, &reads_of(sets)) {
        Ok(doc) => evaluate_document(&doc, input.findings, input.root, sets),
        Err(e) => Verdict {
            sets: sets
                .iter()
                .map(|set| SetVerdict {
                    name: set.name.clone(),
                    namespace: set.namespace.clone(),
                    outcome: Outcome::Error(e.clone()),
                })
                .collect(),
        },
    }
}

/// What the sets' policies read of the plan document, together.
pub fn reads_of(sets: &[PolicySet]) -> InputReads {
    InputReads::of(
        sets.iter()
            .flat_map(|s| s.files.iter().map(|f| f.text.as_str())),
    )
}

/// [`evaluate`] over a plan document already read ([`PlanDocument::read`]), e.g. on another
/// thread while planbot's own checks ran. The sets are independent (each its own interpreter
/// over the one shared document), so they run side by side, one per core.
pub fn evaluate_document(
    plan: &PlanDocument,
    findings: &[Finding],
    root: &str,
    sets: &[PolicySet],
) -> Verdict {
    evaluate_document_with(plan, findings, root, None, sets)
}

/// [`evaluate_document`] with `data.planbot.capacity` (what the plan takes from the Proxmox
/// cluster, when the preflight read it).
pub fn evaluate_document_with(
    plan: &PlanDocument,
    findings: &[Finding],
    root: &str,
    capacity: Option<&serde_json::Value>,
    sets: &[PolicySet],
) -> Verdict {
    let document = rego::Document::new(plan, findings, root, capacity);
    let one = |set: &PolicySet| SetVerdict {
        name: set.name.clone(),
        namespace: set.namespace.clone(),
        outcome: match rego::evaluate_set(&document, set) {
            Ok(results) => Outcome::Checked(results),
            Err(e) => Outcome::Error(e),
        },
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if sets.len() < 2 || cores < 2 {
        return Verdict {
            sets: sets.iter().map(one).collect(),
        };
    }
    // A few threads take the sets in turn; each verdict lands in its set's slot.
    let next = std::sync::atomic::AtomicUsize::new(0);
    let slots: Vec<std::sync::Mutex<Option<SetVerdict>>> =
        sets.iter().map(|_| std::sync::Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..cores.min(sets.len()) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(set) = sets.get(i) else { break };
                let verdict = one(set);
                *slots[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(verdict);
            });
        }
    });
    // A thread that panicked made `scope` panic: every slot is filled here.
    Verdict {
        sets: slots
            .into_iter()
            .map(|slot| {
                slot.into_inner()
                    .unwrap_or_else(|e| e.into_inner())
                    .expect("every set was evaluated")
            })
            .collect(),
    }
}

/// Whether a set can be evaluated at all, without a plan: its files parse (Rego v1 or the
/// older syntax) and its package has a `deny`, `violation` or `warn` rule. What `planbot serve
/// --check` asks of the operator's sets.
pub fn check_set(set: &PolicySet) -> Result<(), PolicyError> {
    rego::check_set(set)
}
