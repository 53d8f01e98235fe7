//! Rendering the MR plan note (design §7) from the templates in `templates/`.

use crate::core::fingerprint::Fingerprint;
use crate::core::lint::Finding;
use crate::core::plan::Plan;
use crate::core::redact::Scrubber;
use std::time::Duration;

/// Size budget for one note (GitLab's hard limit is 1,000,000 characters).
pub const NOTE_BUDGET: usize = 500_000;

/// The hidden marker by which planbot finds its own note again.
pub const NOTE_MARKER: &str = "<!-- planbot:mr-note v1 -->";

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
    /// Lines shown above the headline (merged / applied banners), already in Markdown.
    pub banners: Vec<String>,
    /// Preflight state in words, e.g. "Proxmox preflight skipped: no endpoint configured".
    pub preflight_note: Option<String>,
}

/// Render the whole MR note; every text in it has passed through `scrubber`.
pub fn render_note(ctx: &NoteContext, roots: &[RootSection<'_>], scrubber: &Scrubber) -> String {
    let _ = (ctx, roots, scrubber);
    todo!("issue 2 §4")
}
