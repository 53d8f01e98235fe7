//! Rendering the MR plan note (docs/workflow.md, "The plan note") from the templates in
//! `templates/`.
//!
//! Rust prepares view structs (diff bodies, escaping, budget decisions); every word the reader
//! sees comes from `templates/note.md.j2` and `templates/note_phrases.j2`. The template
//! environment is built once per process. `approved` is the edit of a plan note once every
//! failing policy set of its plans is approved (`planbot approve policies`).

pub mod approved;
mod bodies;
mod budget;
pub mod diff;
pub mod planned_before;
use crate::core::markdown;
pub mod terminal;

use crate::core::engine_checks::{Check, RootChecks, TestStatus, LISTED};
use crate::core::fingerprint::Fingerprint;
use crate::core::plan::{ActionKind, Json, Plan, ResourceChange, Values};
use crate::core::policy::review::PolicySection;
use crate::core::proxmox::findings::{Finding, Severity};
use crate::core::redact::Scrubber;
use crate::core::summary::Summary;
use budget::{Unit, UnitState};
use diff::{Differ, Node, Phrases};
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// Size budget for one note (GitLab's hard limit is 1,000,000 characters).
pub const NOTE_BUDGET: usize = 500_000;

/// No size budget: the whole plan (a local render without `--budget gitlab`).
pub const NO_BUDGET: usize = usize::MAX;

/// The hidden marker by which planbot finds its own note again.
pub const NOTE_MARKER: &str = "<!-- planbot:mr-note v1 -->";

/// The line before the plan note's merged banner (the banner is the line after it): the merge
/// puts it there, the apply's end rewrites the banner to say how the apply ended.
pub const MERGED_BANNER_MARKER: &str = "<!-- planbot:merged -->";

/// At most this many destructive changes and findings are listed one by one (they are always
/// kept, so they must fit the budget themselves); the rest are counted.
const MAX_LISTED: usize = 1000;

/// However tight the budget, at least this many destructive changes and findings are listed.
const MIN_LISTED: usize = 20;

/// The changed files no root claims that the note names (the rest are counted).
const IN_NO_ROOT_SHOWN: usize = 10;

/// What happened to one root in this run.
pub enum RootOutcome<'a> {
    /// Planned: the parsed plan, its lint/preflight findings and fingerprint.
    Planned {
        plan: &'a Plan,
        findings: &'a [Finding],
        fingerprint: &'a Fingerprint,
    },
    /// Not planned, with the reason in words ("no files changed").
    Skipped { reason: String },
    /// The engine failed before producing a plan: the (already redacted) error text.
    Failed { error: String },
}

/// One root's section of the note.
pub struct RootSection<'a> {
    pub name: String,
    pub outcome: RootOutcome<'a>,
}

/// Everything about the run that is not in the plan itself.
#[derive(Debug, Clone, Default)]
pub struct NoteContext {
    /// The commit planned (full SHA; the note shows 8 characters).
    pub sha: Option<String>,
    pub draft: bool,
    /// e.g. "OpenTofu 1.10.6" or "Terraform 1.11.4".
    pub engine: Option<String>,
    pub duration: Option<Duration>,
    /// Link to the run page, when served.
    pub run_url: Option<String>,
    /// Where the run page can be read when it cannot be linked (run pages on the planbot host
    /// only), e.g. `http://localhost:8080/runs/12`.
    pub run_hint: Option<String>,
    /// Lines shown above the headline (merged / applied banners), already in Markdown.
    pub banners: Vec<String>,
    /// Preflight state in words, e.g. "Proxmox preflight skipped: no endpoint configured".
    pub preflight_note: Option<String>,
    /// The engine's (already redacted) error output for roots whose plan is `errored`, by root
    /// name: shown in a fenced block above the partial changes.
    pub plan_errors: BTreeMap<String, String>,
    /// What an operator should know about a root's failure, by root name (the engine's sandbox
    /// refused a connection, with the setting that allows it): shown under its error.
    pub hints: BTreeMap<String, String>,
    /// Each root's "Policies" section (its messages already scrubbed), by root name.
    pub policies: BTreeMap<String, PolicySection>,
    /// What each root's plan takes from the Proxmox cluster next to what is free, by root name.
    pub capacity: BTreeMap<String, crate::core::proxmox::capacity::Capacity>,
    /// For each root planned with an upstream root (`depends_on`) that changes in the same MR,
    /// those upstream roots and their output changes ([`planned_before::planned_before`]): the
    /// root's section says it was planned before their apply.
    pub planned_before: BTreeMap<String, Vec<planned_before::PlannedBefore>>,
    /// The roots whose plan of an earlier push is shown again, each with the head (short) it
    /// was planned at: nothing it depends on changed since.
    pub reused: BTreeMap<String, String>,
    /// Size budget in characters; 0 means [`NOTE_BUDGET`], [`NO_BUDGET`] none.
    pub budget: usize,
    /// A local run (`planbot plan` on the user's machine): no "re-plan: comment" hint.
    pub local_run: bool,
    /// The plan file a local `planbot render` read: the "full plan" hint names it.
    pub plan_file: Option<String>,
    /// The root a local `planbot plan DIR --budget gitlab` planned: the "full plan" hint names
    /// the command that prints it whole.
    pub plan_dir: Option<String>,
    /// A file the MR changes that is broken (its `.planbot.toml`): it fails the status, so
    /// the headline is red and names it, whatever the plans say.
    pub invalid_file: Option<String>,
    /// What the engine's checks said of each root (already redacted), by root name: tests,
    /// format and validation in the "Checks" part, warnings folded under the summary.
    pub checks: BTreeMap<String, RootChecks>,
    /// The roots the MR reaches and why each is planned (`core::reach`), in plan order: the
    /// note lists them when the repository has several roots or a reason is not the root's
    /// own files, and draws them when more than one is planned.
    pub reach: Vec<crate::core::reach::Reached>,
    /// Dependencies between roots, `(upstream, downstream)` by name: the picture's arrows.
    pub root_edges: Vec<(String, String)>,
    /// Config advice: roots that read another root's GitLab-managed state without depending on
    /// it (`core::reach::depends_on_hints`).
    pub depends_hints: Vec<crate::core::reach::DependsHint>,
    /// Changed configuration files no root claims (`core::reach::in_no_root`): listed, and
    /// the headline yellow.
    pub in_no_root: Vec<String>,
    /// The MR's changed files outside every root (a shared module's) that `fmt -check` finds
    /// not formatted: listed under "Checks" (the headline stays as the plans make it).
    pub fmt_outside: Vec<String>,
    /// What the roots' plans waited for before their engines ran: the last line says each wait
    /// of [`NOTICEABLE_WAIT`] or more.
    pub waits: Vec<PlanWait>,
}

/// The shortest wait of a root's plan the note says: shorter ones are not worth a reader's
/// attention (a slot freed as the plan asked).
pub const NOTICEABLE_WAIT: Duration = Duration::from_secs(1);

/// A wait of a root's plan before its engine ran.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PlanWait {
    pub root: String,
    pub on: WaitOn,
    pub took: Duration,
}

/// What a root's plan waited for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum WaitOn {
    /// The author's other plans held the author's `share` of the engine slots.
    AuthorShare { share: usize },
    /// Every one of the `total` engine slots was held.
    Slot { total: usize },
}

/// Render the whole MR note; every value in it has passed through `scrubber` (the template's
/// own words never do, see `core::templates::scrubbing`).
pub fn render_note(ctx: &NoteContext, roots: &[RootSection<'_>], scrubber: &Scrubber) -> String {
    let mut note = Vec::new();
    write_note(ctx, roots, scrubber, &mut note).expect("a Vec takes every byte");
    String::from_utf8(note).expect("the note's templates write UTF-8")
}

/// [`render_note`] written to `out` as it is rendered. Without a budget (`planbot render`) the
/// note is never held whole: a 5,000-resource plan's note is 4 MB.
pub fn write_note(
    ctx: &NoteContext,
    roots: &[RootSection<'_>],
    scrubber: &Scrubber,
    out: &mut dyn std::io::Write,
) -> std::io::Result<()> {
    crate::core::templates::scrubbing(scrubber, || write_scrubbed(ctx, roots, out))
}

/// [`write_note`] inside its scrubbing scope.
fn write_scrubbed(
    ctx: &NoteContext,
    roots: &[RootSection<'_>],
    out: &mut dyn std::io::Write,
) -> std::io::Result<()> {
    let budget = if ctx.budget == 0 {
        NOTE_BUDGET
    } else {
        ctx.budget
    };
    let (mut view, pending) = build_view(ctx, roots);
    out.write_all(NOTE_MARKER.as_bytes())?;
    out.write_all(b"\n")?;
    // Without a limit (`planbot render` without `--budget gitlab`) nothing is ever folded, so
    // nothing is measured (the part always kept, the bodies' sizes): the note is rendered once,
    // its bodies computed beside it.
    if budget == NO_BUDGET {
        return bodies::write_beside_bodies(&mut view, &pending, phrases(), out);
    }
    let mut fixed = fixed_size(&mut view);
    // The destructive changes and findings are kept whole up to MAX_LISTED each; when those lists
    // alone take more than half the budget (thousands of destroyed VMs, each with its finding),
    // list fewer of the longer one (findings are sorted errors first) and count the rest.
    while fixed > budget / 2 {
        let (d, f) = (view.destructive.len(), view.findings.len());
        if d.max(f) <= MIN_LISTED {
            break;
        }
        if d >= f {
            let keep = (d / 2).max(MIN_LISTED);
            view.destructive_more += d - keep;
            view.destructive.truncate(keep);
        } else {
            let keep = (f / 2).max(MIN_LISTED);
            view.findings_more += f - keep;
            view.findings.truncate(keep);
        }
        fixed = fixed_size(&mut view);
    }
    // Aim a little below the budget: sizes are estimates.
    let mut target = budget - budget / 50;
    let units = collect_units(&view);
    let all_folded: usize = units.iter().map(|u| u.folded).sum();
    if fixed + all_folded <= target {
        // Some diffs can be shown: compute them one by one, keeping at most what the room left
        // by the summaries can hold (the largest fold first), then decide which else to fold.
        let room = target - fixed - all_folded;
        bodies::fill_bodies(&mut view, &pending, phrases(), room);
    } else {
        // Even one summary line per resource is too much: no diff can be shown, so none is
        // computed; the budget then drops the largest summaries.
        for (id, _, _) in &pending {
            set_state(&mut view, *id, UnitState::Folded);
        }
    }
    let mut units = collect_units(&view);
    let mut text = String::new();
    // If the estimate still overshoots, tighten and redo.
    for _ in 0..4 {
        let states = budget::plan(&units, fixed, target);
        apply_states(&mut view, &states);
        text = render_view(&mut view, None);
        if text.len() <= budget {
            break;
        }
        let over = text.len() - budget;
        target = target.saturating_sub(over + over / 4 + 64);
        units = collect_units(&view);
    }
    out.write_all(text.as_bytes())
}

// ---------------------------------------------------------------------------------------------
// Templates

/// The phrases of `templates/note_phrases.j2`, read once.
fn phrases() -> &'static Phrases {
    static PHRASES: OnceLock<Phrases> = OnceLock::new();
    PHRASES.get_or_init(|| {
        crate::core::templates::with_state("note_phrases.j2", |state| {
            let get = |name: &str| {
                state
                    .lookup(name)
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_else(|| panic!("templates/note_phrases.j2 sets {name}"))
            };
            Phrases {
                known_after_apply: get("known_after_apply"),
                sensitive: get("sensitive"),
                forces_replacement: get("forces_replacement"),
                decoded_data_url: get("decoded_data_url"),
                decoded_base64: get("decoded_base64"),
                pretty_json: get("pretty_json"),
                embedded_file: get("embedded_file"),
                shown_below: get("shown_below"),
                write_only: get("write_only"),
            }
        })
        .expect("templates/note_phrases.j2 evaluates")
    })
}

fn render_view(view: &mut NoteView<'_>, waiting: Option<&bodies::Waiting>) -> String {
    let mut text = Vec::new();
    write_view(view, waiting, &mut text).expect("a Vec takes every byte");
    String::from_utf8(text).expect("the note's templates write UTF-8")
}

/// [`render_view`] written to `out` as the template goes; only a failing `out` is an error.
fn write_view(
    view: &mut NoteView<'_>,
    waiting: Option<&bodies::Waiting>,
    out: &mut dyn std::io::Write,
) -> std::io::Result<()> {
    // Each root's resource and drift sections are lent to the template as sequences whose items
    // become template values one at a time, as the template reaches them: converting thousands
    // of sections up front would take several times the memory of the note itself.
    let mut lent = Vec::with_capacity(view.details.len());
    for (n, d) in view.details.iter_mut().enumerate() {
        let resources = Arc::new(std::mem::take(&mut d.resources));
        let drift = Arc::new(std::mem::take(&mut d.drift));
        d.resources_seq = minijinja::Value::from_object(bodies::Sections::new(
            Arc::clone(&resources),
            waiting,
            n,
            false,
        ));
        d.drift_seq = minijinja::Value::from_object(bodies::Sections::new(
            Arc::clone(&drift),
            waiting,
            n,
            true,
        ));
        lent.push((resources, drift));
    }
    let written = crate::core::templates::get("note.md.j2")
        .and_then(|tmpl| tmpl.render_captured_to(&*view, &mut *out).map(drop));
    for (d, (resources, drift)) in view.details.iter_mut().zip(lent) {
        d.resources_seq = minijinja::Value::UNDEFINED;
        d.drift_seq = minijinja::Value::UNDEFINED;
        d.resources = Arc::try_unwrap(resources).unwrap_or_else(|shared| (*shared).clone());
        d.drift = Arc::try_unwrap(drift).unwrap_or_else(|shared| (*shared).clone());
    }
    match written {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == minijinja::ErrorKind::WriteFailure => Err(write_failure(e)),
        Err(e) => panic!("templates/note.md.j2 failed to render: {e:#}"),
    }
}

/// The error of the writer under a template's failed write, as it was.
fn write_failure(e: minijinja::Error) -> std::io::Error {
    use std::error::Error as _;
    match e.source().and_then(|s| s.downcast_ref::<std::io::Error>()) {
        Some(io) => std::io::Error::new(io.kind(), io.to_string()),
        None => std::io::Error::other(e.to_string()),
    }
}

// ---------------------------------------------------------------------------------------------
// Views

#[derive(Serialize)]
struct NoteView<'a> {
    banners: &'a [String],
    /// `(root, format_version)` of each plan newer than planbot knows
    /// ([`crate::core::plan::KNOWN_FORMAT`]).
    newer_formats: Vec<(String, String)>,
    known_format: String,
    colour: &'static str,
    invalid_file: Option<&'a str>,
    sha8: Option<String>,
    draft: bool,
    roots_total: usize,
    roots_with_changes: usize,
    /// Roots whose plan failed, or errored part-way: the headline says so first.
    roots_failed: usize,
    multi_root: bool,
    table: Vec<RowView>,
    destructive: Vec<DestructiveView>,
    destructive_more: usize,
    findings: Vec<FindingView>,
    findings_more: usize,
    preflight_note: Option<String>,
    details: Vec<DetailView>,
    left_out: usize,
    run_url: Option<&'a str>,
    run_hint: Option<&'a str>,
    plan_file: Option<&'a str>,
    plan_dir: Option<&'a str>,
    replan_hint: bool,
    engine: Option<&'a str>,
    engine_name: &'static str,
    duration: Option<String>,
    fingerprints: Vec<FingerprintView>,
    /// The engine's checks of each root that has something to say.
    engine_checks: Vec<ChecksView>,
    /// The engine's warnings of every root, each once.
    warnings: Vec<WarningView>,
    /// Warning groups past [`LISTED`], counted.
    warnings_more: usize,
    /// Warnings the plans gave past the different ones planbot keeps of a plan, counted.
    warnings_unread: usize,
    /// How many different warnings of a plan planbot keeps.
    warnings_kept: usize,
    /// How many warnings the engine gave in all (a group counts as often as it was given).
    warnings_total: usize,
    /// Why each root was planned (empty: nothing worth saying).
    reach: &'a [crate::core::reach::Reached],
    /// The planned roots and their order, when more than one is planned.
    picture: Option<PictureView>,
    /// The `depends_on` lines the repo config lacks.
    depends_hints: &'a [crate::core::reach::DependsHint],
    /// The first of the changed files no root claims, and how many more.
    in_no_root: &'a [String],
    in_no_root_more: usize,
    /// The first of the changed files outside the roots not formatted, and how many more.
    fmt_outside: &'a [String],
    fmt_outside_more: usize,
    /// The waits of [`NOTICEABLE_WAIT`] or more before a root's engine ran.
    waits: Vec<WaitView>,
}

#[derive(Serialize)]
struct WaitView {
    root: String,
    /// `share` or `slot`.
    on: &'static str,
    /// The author's share, or every slot.
    slots: usize,
    took: String,
}

/// The waits of [`NOTICEABLE_WAIT`] or more, as the note's last line says them.
fn wait_views(waits: &[PlanWait]) -> Vec<WaitView> {
    waits
        .iter()
        .filter(|w| w.took >= NOTICEABLE_WAIT)
        .map(|w| {
            let (on, slots) = match w.on {
                WaitOn::AuthorShare { share } => ("share", share),
                WaitOn::Slot { total } => ("slot", total),
            };
            WaitView {
                root: w.root.clone(),
                on,
                slots,
                took: duration_text(w.took),
            }
        })
        .collect()
}

/// The roots an MR reaches as a Mermaid graph: node ids are `r0`, `r1`… (never a name), each
/// label passes the `mermaid` filter.
#[derive(Serialize)]
struct PictureView {
    nodes: Vec<(String, String)>,
    edges: Vec<(String, String)>,
}

/// The picture of the roots in `reach` with the `edges` between two of them.
fn picture(
    reach: &[crate::core::reach::Reached],
    edges: &[(String, String)],
) -> Option<PictureView> {
    if reach.len() < 2 {
        return None;
    }
    let id = |name: &str| {
        reach
            .iter()
            .position(|r| r.root == name)
            .map(|i| format!("r{i}"))
    };
    Some(PictureView {
        nodes: reach
            .iter()
            .enumerate()
            .map(|(i, r)| (format!("r{i}"), r.root.clone()))
            .collect(),
        edges: edges
            .iter()
            .filter_map(|(from, to)| Some((id(from)?, id(to)?)))
            .collect(),
    })
}

/// One root's checks as the note lists them; an empty list or `None` says nothing.
#[derive(Serialize)]
struct ChecksView {
    root: String,
    test: Option<TestView>,
    test_not_run: Option<String>,
    validate: Vec<crate::core::engine_checks::Diagnostic>,
    validate_more: usize,
    validate_not_run: Option<String>,
    fmt: Vec<String>,
    fmt_more: usize,
    fmt_not_run: Option<String>,
    check_blocks: Vec<crate::core::engine_checks::CheckBlock>,
}

#[derive(Serialize)]
struct TestView {
    ok: bool,
    passed: usize,
    failed: usize,
    errored: usize,
    skipped: usize,
    runs: Vec<crate::core::engine_checks::TestRun>,
    runs_more: usize,
    errors: Vec<crate::core::engine_checks::Diagnostic>,
}

#[derive(Serialize)]
struct WarningView {
    root: String,
    summary: String,
    count: usize,
    details: Vec<crate::core::engine_checks::WarningDetail>,
    /// Details past [`LISTED`], counted.
    details_more: usize,
}

#[derive(Serialize)]
struct RowView {
    name: String,
    status: &'static str,
    reason: String,
    errored: bool,
    add: usize,
    change: usize,
    destroy: usize,
    import: usize,
    moved: usize,
}

#[derive(Serialize)]
struct DestructiveView {
    root: String,
    address: String,
    deposed: Option<String>,
    kind: ActionKind,
    reason: Option<String>,
    replace_paths: Vec<String>,
    stateful: Option<&'static str>,
    vm_id: Option<String>,
    vm_name: Option<String>,
    node: Option<String>,
}

#[derive(Serialize)]
struct FindingView {
    severity: Severity,
    rule: &'static str,
    address: String,
    message: String,
    fix: String,
    fix_block: bool,
    fence: String,
}

#[derive(Serialize)]
struct FingerprintView {
    root: String,
    short: String,
}

#[derive(Serialize)]
struct DetailView {
    name: String,
    status: &'static str,
    reason: String,
    errored: bool,
    error: Option<String>,
    fence: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    hint: Option<String>,
    no_changes: bool,
    /// Given to the template as `resources_seq` (see [`render_view`]).
    #[serde(skip)]
    resources: Vec<ResourceView>,
    #[serde(rename = "resources")]
    resources_seq: minijinja::Value,
    outputs: Option<OutputsView>,
    /// Given to the template as `drift_seq`.
    #[serde(skip)]
    drift: Vec<ResourceView>,
    #[serde(rename = "drift")]
    drift_seq: minijinja::Value,
    drift_left_out: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    policies: Option<PolicySection>,
    /// The plan's ephemeral resources (`Plan::ephemeral_resources`): not changes, listed as
    /// what they are.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    ephemeral: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    capacity: Option<crate::core::proxmox::capacity::Capacity>,
    /// The upstream roots changed in the same MR that this root was planned before.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    planned_before: Vec<planned_before::PlannedBefore>,
    /// The head (short) this plan was made at, when reused from an earlier push.
    #[serde(skip_serializing_if = "Option::is_none")]
    reused: Option<String>,
}

impl RowView {
    /// A planned root's row, before its counts are known.
    fn planned(name: &str) -> RowView {
        RowView {
            name: name.to_string(),
            status: "planned",
            reason: String::new(),
            errored: false,
            add: 0,
            change: 0,
            destroy: 0,
            import: 0,
            moved: 0,
        }
    }
}

impl DetailView {
    /// A planned root's details, before anything of its plan is read.
    fn planned(name: &str) -> DetailView {
        DetailView {
            name: name.to_string(),
            status: "planned",
            reason: String::new(),
            errored: false,
            error: None,
            fence: String::new(),
            hint: None,
            no_changes: false,
            resources: Vec::new(),
            resources_seq: minijinja::Value::UNDEFINED,
            outputs: None,
            drift: Vec::new(),
            drift_seq: minijinja::Value::UNDEFINED,
            drift_left_out: 0,
            policies: None,
            ephemeral: Vec::new(),
            capacity: None,
            planned_before: Vec::new(),
            reused: None,
        }
    }
}

/// One resource's section. Absent and empty fields are not passed to the template (it reads
/// them as undefined, which tests false and prints nothing): a note lists thousands of these.
#[derive(Serialize, Clone, Debug)]
struct ResourceView {
    symbol: &'static str,
    address: String,
    kind: ActionKind,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    replace_paths: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    previous_address: Option<String>,
    /// `Some("")` when imported without a known id.
    import_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    deposed: Option<String>,
    /// The action list as JSON, only for actions planbot does not know (else empty).
    #[serde(skip_serializing_if = "String::is_empty")]
    actions: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    body: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    fence: String,
    unchanged: usize,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    drift: bool,
    /// A Proxmox resource (bpg's or Telmate's provider): a forget says it stays in Proxmox.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pve: bool,
    state: UnitState,
}

#[derive(Serialize)]
struct OutputsView {
    count: usize,
    body: String,
    fence: String,
    state: UnitState,
}

/// VMs, containers and disks hold data: destroying or replacing them loses it.
fn stateful_kind(resource_type: &str) -> Option<&'static str> {
    let t = resource_type;
    if t.ends_with("_vm") || t.ends_with("_vm_qemu") || t.contains("virtual_machine") {
        Some("vm")
    } else if t.ends_with("_container") || t.ends_with("_lxc") {
        Some("container")
    } else if t.ends_with("_disk") || t.ends_with("_volume") {
        Some("disk")
    } else {
        None
    }
}

fn scalar_text(v: &Json) -> Option<String> {
    match v {
        Json::Str(s) if !s.is_empty() => Some(s.to_string()),
        Json::Number(_) => Some(diff::repr(v)),
        _ => None,
    }
}

/// Whether a sensitivity mask marks anything at all as sensitive.
fn marks_anything(mask: &Json) -> bool {
    match mask {
        Json::Bool(b) => *b,
        Json::Array(items) => items.iter().any(marks_anything),
        Json::Object(map) => map.values().any(marks_anything),
        _ => false,
    }
}

/// A non-sensitive top-level attribute of the object being destroyed (or else created).
fn identity_attr(c: &Values, names: &[&str]) -> Option<String> {
    for (value, mask) in [
        (&c.before, &c.before_sensitive),
        (&c.after, &c.after_sensitive),
    ] {
        for name in names {
            let sensitive = marks_anything(mask.get(*name)) || mask == &Json::Bool(true);
            if sensitive {
                continue;
            }
            if let Some(s) = scalar_text(value.get(*name)) {
                return Some(s);
            }
        }
    }
    None
}

fn duration_text(d: Duration) -> String {
    let secs = d.as_secs_f64();
    if secs < 60.0 {
        format!("{secs:.1} s")
    } else {
        let m = d.as_secs() / 60;
        format!("{m} min {} s", d.as_secs() % 60)
    }
}

fn fenced(text: &str) -> (String, String) {
    let t = markdown::neutralise(text.trim_end()).into_owned();
    let fence = markdown::fence_for(&t);
    (t, fence)
}

/// The summary of one resource; its diff body comes later ([`bodies`]), only when the note has
/// room for diffs at all.
fn resource_view(rc: &ResourceChange, drift: bool) -> ResourceView {
    let kind = rc.kind();
    let c = &rc.change;
    let replace_paths: Vec<String> = c
        .replace_paths
        .iter()
        .flatten()
        .map(|p| diff::path_string(p))
        .filter(|p| !p.is_empty())
        .collect();
    let import_id = c.importing.as_ref().filter(|v| !v.is_null()).map(|imp| {
        imp.get("id")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_default()
    });
    ResourceView {
        symbol: match kind {
            _ if drift => "~",
            ActionKind::NoOp if rc.is_move() => "→",
            ActionKind::NoOp if rc.is_import() => "←",
            k => k.symbol(),
        },
        address: rc.address.clone(),
        kind,
        reason: rc.action_reason.clone(),
        replace_paths,
        previous_address: rc.previous_address.clone().filter(|p| *p != rc.address),
        import_id,
        deposed: rc.deposed.clone(),
        actions: if kind == ActionKind::Unknown {
            serde_json::to_string(&c.actions).unwrap_or_default()
        } else {
            String::new()
        },
        body: String::new(),
        fence: String::new(),
        unchanged: 0,
        drift,
        pve: rc.resource_type.starts_with("proxmox_"),
        state: UnitState::Full,
    }
}

/// The attribute diff of one change, as the note's ```diff blocks show it (changed leaves by
/// path, `~ input.cores = 2 -> 8`, through the masks; long texts as line diffs). `reversed`
/// reads it from `after` to `before` (drift: from `main`'s code to reality). Not neutralised:
/// the caller puts it in a fence of its own.
pub fn attribute_diff(c: &Values, reversed: bool) -> diff::DiffBody {
    let differ = Differ::new(phrases());
    let differ = if reversed {
        differ.unknown_first()
    } else {
        differ
    };
    differ.diff("", Node::of_change(c, reversed))
}

type UnitId = (usize, u8, usize);

fn resource_at<'v>(view: &'v mut NoteView<'_>, (d, part, i): UnitId) -> &'v mut ResourceView {
    let detail = &mut view.details[d];
    if part == 0 {
        &mut detail.resources[i]
    } else {
        &mut detail.drift[i]
    }
}

fn set_state(view: &mut NoteView<'_>, (d, part, i): UnitId, state: UnitState) {
    let detail = &mut view.details[d];
    match part {
        0 => detail.resources[i].state = state,
        1 => {
            if let Some(o) = &mut detail.outputs {
                o.state = state;
            }
        }
        _ => detail.drift[i].state = state,
    }
}

fn outputs_view(plan: &Plan, phrases: &Phrases) -> Option<OutputsView> {
    let mut body = String::new();
    let mut count = 0;
    let yes = Value::Bool(true);
    for (name, oc) in &plan.output_changes {
        if oc.kind() == ActionKind::NoOp {
            continue;
        }
        count += 1;
        let sensitive = oc.is_sensitive();
        let mask = |m| if sensitive { &yes } else { m };
        let null = Value::Null;
        let (before, after) = match oc.kind() {
            ActionKind::Create => (&null, &oc.after),
            ActionKind::Delete => (&oc.before, &null),
            _ => (&oc.before, &oc.after),
        };
        // Read again as the resources' values are, for the same diff (outputs are few and
        // small).
        let texts = [
            before,
            after,
            &oc.after_unknown,
            mask(&oc.before_sensitive),
            mask(&oc.after_sensitive),
        ]
        .map(|v| serde_json::to_string(v).unwrap_or_default());
        let [before, after, unknown, bs, as_] = texts
            .each_ref()
            .map(|t| serde_json::from_str::<Json>(t).unwrap_or_default());
        let d = Differ::new(phrases).diff(
            &markdown_safe_name(name),
            Node::new(&before, &after, &unknown, &bs, &as_),
        );
        body.push_str(&d.text);
    }
    if count == 0 {
        return None;
    }
    let body = markdown::neutralise(&body).into_owned();
    let fence = markdown::fence_for(&body);
    Some(OutputsView {
        count,
        body,
        fence,
        state: UnitState::Full,
    })
}

fn markdown_safe_name(name: &str) -> String {
    name.to_string()
}

/// A resource change whose diff body is rendered once the note's budget is known: its unit, the
/// plan it belongs to (for the attributes a replacement forces) and the change.
type PendingDiff<'r> = (UnitId, Option<&'r Plan>, &'r ResourceChange);

/// The note's view of `roots`, and the resource changes whose diff bodies are still to render
/// (rendered once the budget is known). Each root is read by [`root_views`]; the lists they
/// gather are then sorted and cut to [`MAX_LISTED`].
fn build_view<'a, 'r>(
    ctx: &'a NoteContext,
    roots: &'r [RootSection<'r>],
) -> (NoteView<'a>, Vec<PendingDiff<'r>>) {
    let mut g = Gathered::default();
    let mut table = Vec::new();
    let mut details = Vec::new();
    for (d, root) in roots.iter().enumerate() {
        let (row, detail) = root_views(ctx, d, root, &mut g);
        table.push(row);
        details.push(detail);
    }
    let Gathered {
        pending,
        red,
        yellow,
        destructive,
        mut findings,
        fingerprints,
        roots_with_changes,
        roots_failed,
    } = g;

    findings.sort_by_key(|(_, f)| f.severity);
    let (findings, findings_more) = first(findings, MAX_LISTED);
    let findings = findings.into_iter().map(|(_, f)| finding_view(f)).collect();
    let (destructive, destructive_more) = first(destructive, MAX_LISTED);

    let (engine_checks, warnings, checks_red, checks_yellow) = checks_views(ctx, roots);
    // Warnings a plan gave past those planbot keeps: counted in the total, said below it.
    let warnings_unread: usize = roots
        .iter()
        .filter_map(|r| ctx.checks.get(&r.name))
        .map(|c| c.warnings_unread)
        .sum();
    let warnings_total = warnings.iter().map(|w| w.count).sum::<usize>() + warnings_unread;
    let (warnings, warnings_more) = first(warnings, LISTED);
    let newer_formats = roots
        .iter()
        .filter_map(|r| match &r.outcome {
            RootOutcome::Planned { plan, .. } => {
                plan.newer_format().map(|v| (r.name.clone(), v.to_string()))
            }
            _ => None,
        })
        .collect();
    let (major, minor) = crate::core::plan::KNOWN_FORMAT;
    let view = NoteView {
        banners: &ctx.banners,
        newer_formats,
        known_format: format!("{major}.{minor}"),
        invalid_file: ctx.invalid_file.as_deref(),
        colour: headline_colour(
            ctx,
            red || checks_red,
            yellow || checks_yellow || !ctx.in_no_root.is_empty(),
        ),
        sha8: ctx.sha.as_deref().map(|s| s.chars().take(8).collect()),
        draft: ctx.draft,
        roots_total: roots.len(),
        roots_with_changes,
        roots_failed,
        multi_root: roots.len() > 1,
        table,
        destructive,
        destructive_more,
        findings,
        findings_more,
        preflight_note: ctx.preflight_note.clone(),
        details,
        left_out: 0,
        run_url: ctx.run_url.as_deref(),
        run_hint: ctx.run_hint.as_deref(),
        plan_file: ctx.plan_file.as_deref(),
        plan_dir: ctx.plan_dir.as_deref(),
        replan_hint: !ctx.local_run,
        engine: ctx.engine.as_deref(),
        engine_name: engine_name(ctx),
        duration: ctx.duration.map(duration_text),
        fingerprints,
        engine_checks,
        warnings,
        warnings_more,
        warnings_unread,
        warnings_kept: crate::core::engine_checks::PLAN_WARNINGS_KEPT,
        warnings_total,
        reach: reach_shown(ctx, roots),
        picture: picture(&ctx.reach, &ctx.root_edges),
        depends_hints: &ctx.depends_hints,
        in_no_root: &ctx.in_no_root[..ctx.in_no_root.len().min(IN_NO_ROOT_SHOWN)],
        in_no_root_more: ctx.in_no_root.len().saturating_sub(IN_NO_ROOT_SHOWN),
        fmt_outside: &ctx.fmt_outside[..ctx.fmt_outside.len().min(LISTED)],
        fmt_outside_more: ctx.fmt_outside.len().saturating_sub(LISTED),
        waits: wait_views(&ctx.waits),
    };
    (view, pending)
}

/// The first `max` of `items`, and how many more there were.
fn first<T>(mut items: Vec<T>, max: usize) -> (Vec<T>, usize) {
    let more = items.len().saturating_sub(max);
    items.truncate(max);
    (items, more)
}

/// The headline's colour: red for a failure (or an invalid `.planbot.toml`), yellow for
/// something to look at, else green.
fn headline_colour(ctx: &NoteContext, red: bool, yellow: bool) -> &'static str {
    if red || ctx.invalid_file.is_some() {
        "red"
    } else if yellow {
        "yellow"
    } else {
        "green"
    }
}

/// The engine as the footer names it: Terraform when it says so, else OpenTofu.
fn engine_name(ctx: &NoteContext) -> &'static str {
    match ctx.engine.as_deref() {
        Some(e) if e.to_ascii_lowercase().starts_with("terraform") => "Terraform",
        _ => "OpenTofu",
    }
}

/// What each root reads, shown when it says more than "its own files" (or there are several
/// roots); else nothing.
fn reach_shown<'a>(
    ctx: &'a NoteContext,
    roots: &[RootSection<'_>],
) -> &'a [crate::core::reach::Reached] {
    let says_more = ctx.reach.iter().any(|r| {
        !r.outside.is_empty()
            || !r.unread.is_empty()
            || r.why
                .iter()
                .any(|w| !matches!(w, crate::core::reach::Why::OwnFiles { .. }))
    });
    if roots.len() > 1 || says_more {
        &ctx.reach
    } else {
        &[]
    }
}

/// The engine's checks of `roots` (in their order) as the note lists them, their warnings, and
/// whether they make the headline red (a test or validation failed, tests could not run) or
/// yellow (a `check` block failed, a check could not run).
fn checks_views(
    ctx: &NoteContext,
    roots: &[RootSection<'_>],
) -> (Vec<ChecksView>, Vec<WarningView>, bool, bool) {
    let (mut views, mut warnings, mut red, mut yellow) = (Vec::new(), Vec::new(), false, false);
    fn listed<T: Clone>(items: &[T]) -> (Vec<T>, usize) {
        let shown: Vec<T> = items.iter().take(LISTED).cloned().collect();
        let more = items.len() - shown.len();
        (shown, more)
    }
    fn not_run<T>(c: &Check<T>) -> Option<String> {
        match c {
            Check::NotRun { reason } => Some(reason.clone()),
            _ => None,
        }
    }
    for root in roots {
        let Some(c) = ctx.checks.get(&root.name) else {
            continue;
        };
        for w in &c.warnings {
            let (details, details_more) = listed(&w.details);
            warnings.push(WarningView {
                root: root.name.clone(),
                summary: w.summary.clone(),
                count: w.count,
                details,
                details_more,
            });
        }
        let test = c.test.result().map(|t| {
            // Failures first: a long list keeps them.
            let runs: Vec<_> = t
                .runs
                .iter()
                .filter(|r| r.status != TestStatus::Pass)
                .chain(t.runs.iter().filter(|r| r.status == TestStatus::Pass))
                .cloned()
                .collect();
            let (runs, runs_more) = first(runs, LISTED);
            TestView {
                ok: t.ok(),
                passed: t.passed,
                failed: t.failed,
                errored: t.errored,
                skipped: t.skipped,
                runs,
                runs_more,
                errors: t.errors.iter().take(LISTED).cloned().collect(),
            }
        });
        let (validate, validate_more) = listed(c.validate.result().map_or(&[][..], |v| v));
        let (fmt, fmt_more) = listed(c.fmt.result().map_or(&[][..], |v| v));
        let view = ChecksView {
            root: root.name.clone(),
            test_not_run: not_run(&c.test),
            test,
            validate,
            validate_more,
            validate_not_run: not_run(&c.validate),
            fmt,
            fmt_more,
            fmt_not_run: not_run(&c.fmt),
            check_blocks: c.check_blocks.iter().take(LISTED).cloned().collect(),
        };
        red |= view.test.as_ref().is_some_and(|t| !t.ok)
            || view.test_not_run.is_some()
            || !view.validate.is_empty();
        // Formatting and warnings alone leave the headline as the plan makes it.
        yellow |= !view.check_blocks.is_empty()
            || view.fmt_not_run.is_some()
            || view.validate_not_run.is_some();
        let says_something = view.test.is_some()
            || view.test_not_run.is_some()
            || !view.validate.is_empty()
            || view.validate_not_run.is_some()
            || !view.fmt.is_empty()
            || view.fmt_not_run.is_some()
            || !view.check_blocks.is_empty();
        if says_something {
            views.push(view);
        }
    }
    (views, warnings, red, yellow)
}

/// What [`build_view`] gathers over all roots, besides each root's row and details.
#[derive(Default)]
struct Gathered<'r> {
    /// The resource changes whose diff bodies are still to render, by where they go.
    pending: Vec<PendingDiff<'r>>,
    /// Something needs attention before merging (a failure, a stateful destroy, an error).
    red: bool,
    /// Something changes or replaces what exists, or a warning.
    yellow: bool,
    destructive: Vec<DestructiveView>,
    findings: Vec<(String, &'r Finding)>,
    fingerprints: Vec<FingerprintView>,
    roots_with_changes: usize,
    roots_failed: usize,
}

impl<'r> Gathered<'r> {
    /// A root's lint and preflight findings: errors make the note red, warnings yellow.
    fn add_findings(&mut self, root: &str, findings: &'r [Finding]) {
        for f in findings.iter() {
            match f.severity {
                Severity::Error => self.red = true,
                Severity::Warning => self.yellow = true,
                Severity::Info => {}
            }
            self.findings.push((root.to_string(), f));
        }
    }
}

/// The summary table's row and the details of root number `d`.
fn root_views<'r>(
    ctx: &NoteContext,
    d: usize,
    root: &'r RootSection<'r>,
    g: &mut Gathered<'r>,
) -> (RowView, DetailView) {
    let mut row = RowView::planned(&root.name);
    let mut detail = DetailView::planned(&root.name);
    detail.hint = ctx.hints.get(&root.name).cloned();
    match &root.outcome {
        RootOutcome::Skipped { reason } => {
            row.status = "skipped";
            row.reason = reason.clone();
            detail.status = "skipped";
            detail.reason = reason.clone();
        }
        RootOutcome::Failed { error } => {
            g.red = true;
            g.roots_failed += 1;
            row.status = "failed";
            detail.status = "failed";
            let (e, f) = fenced(error);
            detail.error = Some(e);
            detail.fence = f;
        }
        RootOutcome::Planned {
            plan,
            findings,
            fingerprint,
        } => {
            let s = Summary::of(plan);
            row.add = s.add;
            row.change = s.change;
            row.destroy = s.destroy;
            row.import = s.import;
            row.moved = s.moved;
            row.errored = plan.errored;
            if plan.errored {
                g.roots_failed += 1;
            }
            g.fingerprints.push(FingerprintView {
                root: root.name.clone(),
                short: fingerprint.short().to_string(),
            });
            plan_details(ctx, d, plan, &mut detail, g);
            let has_changes = !s.is_empty() || detail.outputs.is_some();
            if has_changes {
                g.roots_with_changes += 1;
            }
            detail.no_changes = !has_changes && !plan.errored;
            g.add_findings(&root.name, findings);
            if let Some(section) = ctx.policies.get(&root.name) {
                if section.blocks() {
                    g.red = true;
                } else if section.has_warnings() || section.overridden() {
                    g.yellow = true;
                }
                detail.policies = Some(section.clone());
            }
            detail.capacity = ctx.capacity.get(&root.name).cloned();
            detail.planned_before = ctx
                .planned_before
                .get(&root.name)
                .cloned()
                .unwrap_or_default();
            detail.reused = ctx.reused.get(&root.name).cloned();
        }
    }
    (row, detail)
}

/// The details of a planned root `d`: its error, resource changes, outputs and drift. The
/// resource changes and drift go to `g.pending` (their bodies are rendered later), the
/// destructive ones also to `g.destructive`.
fn plan_details<'r>(
    ctx: &NoteContext,
    d: usize,
    plan: &'r Plan,
    detail: &mut DetailView,
    g: &mut Gathered<'r>,
) {
    detail.errored = plan.errored;
    if plan.errored {
        g.red = true;
        if let Some(err) = ctx.plan_errors.get(&detail.name) {
            let (e, f) = fenced(err);
            detail.error = Some(e);
            detail.fence = f;
        }
    }
    // Sized once: these lists are the largest part of a big note's view.
    let count = plan.managed_changes().filter(|rc| rc.has_change()).count();
    detail.resources.reserve_exact(count);
    for rc in plan.managed_changes().filter(|rc| rc.has_change()) {
        let kind = rc.kind();
        if !matches!(kind, ActionKind::Create | ActionKind::NoOp) {
            g.yellow = true;
        }
        if kind.is_destructive() {
            let v = destructive_view(&detail.name, rc, kind);
            if v.stateful.is_some() {
                g.red = true;
            }
            g.destructive.push(v);
        }
        g.pending
            .push(((d, 0, detail.resources.len()), Some(plan), rc));
        detail.resources.push(resource_view(rc, false));
    }
    detail.ephemeral = plan.ephemeral_resources();
    detail.outputs = outputs_view(plan, phrases());
    if detail.outputs.is_some() {
        g.yellow |= plan
            .output_changes
            .values()
            .any(|o| !matches!(o.kind(), ActionKind::NoOp | ActionKind::Create));
    }
    for rc in plan
        .resource_drift
        .iter()
        .filter(|rc| rc.is_managed() && rc.kind() != ActionKind::NoOp)
    {
        g.pending.push(((d, 2, detail.drift.len()), None, rc));
        detail.drift.push(resource_view(rc, true));
    }
}

/// The "destroyed or replaced" list's entry for `rc`; a stateful resource (a VM, a container,
/// a disk) names what is lost by its id, name and node.
fn destructive_view(root: &str, rc: &ResourceChange, kind: ActionKind) -> DestructiveView {
    let stateful = stateful_kind(&rc.resource_type);
    let v = resource_view_header(rc);
    let values = stateful.map(|_| rc.change.values());
    let identity = |names: &[&str]| values.as_ref().and_then(|c| identity_attr(c.get(), names));
    DestructiveView {
        root: root.to_string(),
        address: rc.address.clone(),
        deposed: rc.deposed.clone(),
        kind,
        reason: v.0,
        replace_paths: v.1,
        stateful,
        vm_id: stateful
            .filter(|k| *k != "disk")
            .and_then(|_| identity(&["vm_id", "vmid"])),
        vm_name: stateful
            .filter(|k| *k != "disk")
            .and_then(|_| identity(&["name", "hostname"])),
        node: stateful.and_then(|_| identity(&["node_name", "target_node"])),
    }
}

/// A finding as the note lists it; a fix of several lines goes in a fenced block.
fn finding_view(f: &Finding) -> FindingView {
    let fix = f.fix.trim_end();
    let fix_block = fix.contains('\n');
    let (fix, fence) = if fix_block {
        fenced(fix)
    } else {
        (fix.to_string(), String::new())
    };
    FindingView {
        severity: f.severity,
        rule: f.rule,
        address: f.address.clone(),
        message: f.message.clone(),
        fix,
        fix_block,
        fence,
    }
}

fn resource_view_header(rc: &ResourceChange) -> (Option<String>, Vec<String>) {
    let paths = rc
        .change
        .replace_paths
        .iter()
        .flatten()
        .map(|p| diff::path_string(p))
        .filter(|p| !p.is_empty())
        .collect();
    (rc.action_reason.clone(), paths)
}

// ---------------------------------------------------------------------------------------------
// Budget glue: every resource, drift entry and output block is a unit that can be folded
// (one summary line) or dropped (counted in "N resources left out").

/// Estimated (full, folded) size of a resource section; `render_note` corrects any overshoot.
fn resource_sizes(r: &ResourceView) -> (usize, usize) {
    let addr = r.address.len() * 11 / 10;
    let reason = if r.replace_paths.is_empty() {
        r.reason.as_ref().map_or(0, |_| 60)
    } else {
        r.replace_paths.iter().map(|p| p.len() + 15).sum::<usize>() + 35
    };
    let summary = addr + reason + 50;
    let mut extra = r
        .previous_address
        .as_ref()
        .map_or(0, |p| p.len() + addr + 30);
    extra += r.import_id.as_ref().map_or(0, |i| i.len() + 40);
    extra += r.deposed.as_ref().map_or(0, |d| d.len() + 110);
    extra += if r.kind == ActionKind::Unknown { 80 } else { 0 };
    let mut diff = 0;
    if !r.body.is_empty() || r.unchanged > 0 {
        diff = r.body.len() + r.fence.len() * 2 + 12;
    }
    if r.unchanged > 0 {
        diff += 35;
    }
    (summary + extra + diff + 14, addr + reason + 75)
}

fn collect_units(view: &NoteView<'_>) -> Vec<Unit> {
    let mut units = Vec::new();
    for (d, detail) in view.details.iter().enumerate() {
        for (i, r) in detail.resources.iter().enumerate() {
            let (full, folded) = resource_sizes(r);
            units.push(Unit {
                id: (d, 0, i),
                full,
                folded,
                state: r.state,
            });
        }
        if let Some(o) = &detail.outputs {
            units.push(Unit {
                id: (d, 1, 0),
                full: o.body.len() + 200,
                folded: 100,
                state: o.state,
            });
        }
        for (i, r) in detail.drift.iter().enumerate() {
            let (full, folded) = resource_sizes(r);
            units.push(Unit {
                id: (d, 2, i),
                full,
                folded,
                state: r.state,
            });
        }
    }
    units
}

/// Everything that is always kept (headline, table, destructive callout, findings, errors,
/// footer), measured by rendering the note without any resource, output or drift section.
fn fixed_size(view: &mut NoteView<'_>) -> usize {
    let mut taken = Vec::with_capacity(view.details.len());
    for d in &mut view.details {
        taken.push((
            std::mem::take(&mut d.resources),
            d.outputs.take(),
            std::mem::take(&mut d.drift),
        ));
    }
    // Room for the "N resources left out" line.
    let size = render_view(view, None).len() + 150;
    for (d, (r, o, dr)) in view.details.iter_mut().zip(taken) {
        d.resources = r;
        d.outputs = o;
        d.drift = dr;
    }
    size
}

fn apply_states(view: &mut NoteView<'_>, states: &[(UnitId, UnitState)]) {
    let mut left_out = 0;
    for &(id, state) in states {
        set_state(view, id, state);
    }
    for detail in &mut view.details {
        let before = detail.resources.len();
        detail.resources.retain(|r| r.state != UnitState::Dropped);
        left_out += before - detail.resources.len();
        let before = detail.drift.len();
        detail.drift.retain(|r| r.state != UnitState::Dropped);
        detail.drift_left_out += before - detail.drift.len();
        if detail
            .outputs
            .as_ref()
            .is_some_and(|o| o.state == UnitState::Dropped)
        {
            if let Some(o) = &mut detail.outputs {
                o.state = UnitState::Folded;
            }
        }
    }
    view.left_out += left_out;
}
